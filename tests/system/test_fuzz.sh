#!/usr/bin/env bash
# Fuzzes the input parsers with libFuzzer under ASan and UBSan, FUZZ_SECONDS (default 15) each, two
# at a time: the YAML config loader, the shard reader, the checkpoint reader, the tokenizer's
# encoder (real Llama-3 model from ../shared) and its model-file loader. One check per target: no
# crash, no hang (-timeout), no leak, no sanitizer report, and the targets' own asserts hold
# (tests/fuzz/*.c). Seeds: tests/fuzz/corpus/<target>/, plus binary shard and checkpoint seeds
# written by tests/fuzz/make_seeds.c. Inputs that fail are kept in build/fuzz/crashes/.
# Needs clang with libFuzzer (`make test` installs it when it can); without one it says so and fails.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
secs=${FUZZ_SECONDS:-15}
CLANG=${CLANG:-$(command -v clang || command -v clang-14)}
out=build/fuzz
targets=(config shard checkpoint tokenizer tokenizer_model)
if [ -z "$CLANG" ] || ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
    "$CLANG" -x c -fsanitize=fuzzer - -o /tmp/fuzz_probe_$$ 2>/dev/null; then
  echo "FAIL: no clang with libFuzzer (install it: sudo apt-get install clang libclang-rt-dev)"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
rm -f /tmp/fuzz_probe_$$

# The library sources the targets need, built once per run with the sanitizers (no OpenMP: the
# pragmas are ignored, the code is the same).
mkdir -p "$out/obj" "$out/crashes"
FLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -I. -Wno-unknown-pragmas -fsanitize=address,undefined -fno-sanitize-recover=all)
LIB=(common/common.c run/config.c model/llama_config.c fp4/recipe.c run/checkpoint.c data/shard.c data/tokenizer.c
     data/evals.c data/json.c data/blend.c)
LIBS=(-lyaml -lzstd -lpcre2-8 -lm)
# The C libraries as the build found them (build/deps.mk): the system's, or unpacked under a prefix.
DEPS_ROOT=${DEPS_ROOT-$(sed -n 's/^DEPS_ROOT := //p' build/deps.mk 2>/dev/null)}
if [ -n "$DEPS_ROOT" ]; then
  FLAGS+=(-I"$DEPS_ROOT/usr/include")
  # the multiarch folder as deps.sh names it (the C compiler's triplet: clang says x86_64-pc-linux-gnu)
  LIBS=(-L"$DEPS_ROOT/usr/lib/$("${CC:-cc}" -dumpmachine)" -Wl,-Bstatic -lyaml -lzstd -lpcre2-8 -Wl,-Bdynamic -lm)
fi
t0=$SECONDS
printf '%s\n' "${LIB[@]}" | xargs -P 2 -I{} sh -c \
  'o='"$out"'/obj/$(echo {} | tr / _).o; "$0" "$@" -fsanitize=fuzzer-no-link -c {} -o "$o"' "$CLANG" "${FLAGS[@]}" ||
  { echo "FAIL: building the library for fuzzing"; echo "0 passed, ${#targets[@]} failed"; exit 1; }
objs=("$out"/obj/*.o)
for t in "${targets[@]}"; do
  "$CLANG" "${FLAGS[@]}" -fsanitize=fuzzer "tests/fuzz/fuzz_$t.c" "${objs[@]}" "${LIBS[@]}" -o "$out/fuzz_$t" &
done
wait
"$CLANG" "${FLAGS[@]}" tests/fuzz/make_seeds.c "${objs[@]}" "${LIBS[@]}" -o "$out/make_seeds"
echo "built the fuzz targets in $((SECONDS - t0)) s"

# Fresh corpora each run: libFuzzer adds what it finds to the first directory, the seeds stay clean.
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/seeds/shard" "$work/seeds/checkpoint"
"$out/make_seeds" "$work/seeds" || echo "FAIL: make_seeds"
mv "$work/seeds/checkpoint" "$work/seeds/ck" && mkdir "$work/seeds/checkpoint" &&
  for d in "$work"/seeds/ck/*; do cp "$d"/ckpt_*.bin "$work/seeds/checkpoint/$(basename "$d").bin"; done

declare -A max_len=([config]=4096 [shard]=8192 [checkpoint]=8192 [tokenizer]=2048 [tokenizer_model]=4096)
run_target() {
  local t=$1 seeds="$work/seeds/$1"
  mkdir -p "$work/corpus_$t"
  [ -d "tests/fuzz/corpus/$t" ] && seeds="tests/fuzz/corpus/$t"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len[$t]}" \
    -artifact_prefix="$out/crashes/${t}_" -print_final_stats=1 "$work/corpus_$t" "$seeds" >"$work/$t.log" 2>&1
  echo $? >"$work/$t.rc"
}
for ((i = 0; i < ${#targets[@]}; i += 2)); do  # two at a time on two cores
  run_target "${targets[i]}" &
  [ $((i + 1)) -lt ${#targets[@]} ] && run_target "${targets[i + 1]}" &
  wait
done
for t in "${targets[@]}"; do
  rc=$(cat "$work/$t.rc")
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | tr -dc 0-9)
  echo "fuzz_$t: ${runs:-0} inputs in ${secs}s, exit $rc"
  ok='[ "$rc" -eq 0 ] && [ "${runs:-0}" -gt 0 ] && ! grep -Eq "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:" "$work/$t.log"'
  eval "$ok" || grep -E -A 12 "ERROR|runtime error|^error|fuzz_" "$work/$t.log" | head -n 40
  check "fuzz_$t: no crash, hang, leak or sanitizer report" "$ok"
done
echo "$pass passed, $fail failed"
