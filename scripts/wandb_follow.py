#!/usr/bin/env python3
"""Follows a run's JSONL metrics log (logging.file) into a Weights & Biases run, while the run trains
or after it ended.

    python3 scripts/wandb_follow.py runs/x/metrics.jsonl --project fp4train [--entity E] [--name N]
        [--pid PID | --once] [--state FILE] [--poll S]

Each record with a "step" is logged at that step, each number under its key (an event's numbers as
EVENT/KEY, e.g. "skipped/in_a_row"): the names the TensorBoard files use (docs/logging.md). The header
record that every start of ./train writes gives the run's config: the effective config as YAML (what
./train CONFIG --print-config prints), the backend and the MFU conventions.

The W&B run's id is kept next to the log (LOG.wandb.json, with how far the log was read), so that the
follower started again, after the training was resumed or after the follower itself stopped,
continues the same W&B run (wandb.init(id=..., resume="allow")) from where it left off. A log
started anew (a fresh training run truncates it) starts a new W&B run.

It follows until the log's "end" record (the training finished, or stopped on a signal and saved),
or, with --pid, until that process is gone (a killed run); --once reads what is there and stops.

A resumed training logs {"step": S, "event": "resumed"} and then the steps after its checkpoint S
again. W&B keeps one value per key and step and its steps only grow, so those repeated records are
skipped: W&B keeps the first values (the same bits on the CPU and with parallel.deterministic: true),
where the JSONL's readers take the later ones. WANDB_MODE=offline writes the run under WANDB_DIR
(default ./wandb) for `wandb sync`.
"""
import argparse
import json
import os
import secrets
import string
import sys
import time


def numbers(rec):
    """The record's numbers by their W&B key: KEY, or EVENT/KEY for an event record."""
    event = rec.get("event")
    out = {}
    for k, v in rec.items():
        if k in ("step", "event") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[f"{event}/{k}" if event else k] = v
    return out


def header_config(rec):
    """W&B config from a header record: the YAML config as nested keys, plus the engine's facts."""
    cfg = {}
    text = rec.get("config", "")
    try:
        import yaml  # wandb depends on PyYAML

        cfg = yaml.safe_load(text) or {}
    except ImportError:
        cfg = {"config_yaml": text}
    for k in ("backend", "mfu_conventions", "flops_per_token"):
        if k in rec:
            cfg[k] = rec[k]
    return cfg


class Follower:
    def __init__(self, args):
        self.args = args
        self.state_path = args.state or args.log + ".wandb.json"
        self.state = {}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state = json.load(f)
        self.run = None
        self.last_step = self.state.get("step", -1)  # the highest step given to W&B
        # Records at last_step may still be merged into its row while this process has it open;
        # after a restart that row is closed, so a record must come after it.
        self.row_open = False
        self.repeated = 0
        self.logged = 0

    def save_state(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.state_path)

    def open_run(self, config):
        import wandb

        if "run_id" not in self.state:
            alphabet = string.ascii_lowercase + string.digits  # what W&B's own ids are made of
            self.state["run_id"] = "".join(secrets.choice(alphabet) for _ in range(8))
            self.save_state()
        a = self.args
        self.run = wandb.init(project=a.project, entity=a.entity, name=a.name, id=self.state["run_id"],
                              resume="allow", config=config, dir=os.environ.get("WANDB_DIR"))
        print(f"wandb_follow: {a.log} -> W&B run {self.state['run_id']}", flush=True)

    def handle(self, rec, where):
        if "step" not in rec:
            if rec.get("event") == "header":
                if self.run is None:
                    self.open_run(header_config(rec))
                else:
                    self.run.config.update(header_config(rec), allow_val_change=True)
            return
        step = rec["step"]
        if rec.get("event") == "resumed":
            print(f"wandb_follow: {where}: the training resumed at step {step}; W&B has steps up to "
                  f"{self.last_step}", flush=True)
            return
        vals = numbers(rec)
        if not vals:
            return
        if step < self.last_step or (step == self.last_step and not self.row_open):
            self.repeated += 1  # a resumed run's repeat of a step W&B has
            return
        if self.run is None:  # a log without a header (written before headers existed)
            self.open_run(None)
        self.run.log(vals, step=step)
        self.logged += 1
        self.last_step, self.row_open = step, True

    def follow(self):
        a = self.args
        offset = self.state.get("offset", 0)
        if os.path.exists(a.log) and os.path.getsize(a.log) < offset:
            print(f"wandb_follow: {a.log} is shorter than where it was left ({offset} bytes): the log was "
                  "started anew, so a new W&B run", flush=True)
            self.state, offset, self.last_step = {}, 0, -1
        ended = False
        while True:
            alive = a.pid is None or pid_alive(a.pid)  # before reading: what it wrote is then all there
            lines = []
            if os.path.exists(a.log):
                with open(a.log, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                end = data.rfind(b"\n") + 1  # whole lines only: the writer may be mid-line
                lines = data[:end].splitlines(keepends=True)
            for raw in lines:
                where = f"{a.log} at byte {offset}"
                offset += len(raw)
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError as e:
                    sys.exit(f"wandb_follow: {where}: not JSON ({e})")
                self.handle(rec, where)
                ended = rec.get("event") == "end"
            if lines:
                self.state.update(offset=offset, step=self.last_step)
                if "run_id" in self.state:
                    self.save_state()
            if a.once or (ended and not a.pid) or not alive:
                break
            time.sleep(a.poll)
        if self.run is not None:
            self.run.finish()
        print(f"wandb_follow: {self.logged} records logged, {self.repeated} repeated ones skipped, up to step "
              f"{self.last_step}", flush=True)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its parent) is gone too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", help="the run's JSONL log (logging.file)")
    p.add_argument("--project", default="fp4train")
    p.add_argument("--entity", default=None)
    p.add_argument("--name", default=None, help="the W&B run's display name")
    p.add_argument("--pid", type=int, default=None, help="the training process: stop once it is gone")
    p.add_argument("--once", action="store_true", help="log what the file holds now, then stop")
    p.add_argument("--state", default=None, help="where the W&B run id is kept (default: LOG.wandb.json)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads of a growing log")
    Follower(p.parse_args()).follow()


if __name__ == "__main__":
    main()
