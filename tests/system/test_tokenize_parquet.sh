#!/usr/bin/env bash
# ./train tokenize over parquet files written by pyarrow itself (the format's own writer): a text
# column not named "text" (--text-field), several row groups and small pages, snappy and zstd,
# dictionary-encoded string and plain large_string columns, nulls and empty strings (both skipped
# as empty documents), a UTF-8 mix. The shards must be byte for byte those of the same documents as
# .jsonl, for one input and for several inputs split with --part; progress lines give a share of the
# input and an ETA; a missing column, an int column, a truncated file, a corrupt page and a file that
# is not parquet are refused, naming the file. In a build without the parquet reader, the refusal
# says so.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[ -d .deps/py ] && export PYTHONPATH="$PWD/.deps/py${PYTHONPATH:+:$PYTHONPATH}"  # pyarrow from make test's set-up
first_file() { for f in "$@"; do [ -n "$f" ] && [ -e "$f" ] && { echo "$f"; return; }; done; }
tok=$(first_file "${TOKENIZER_MODEL:-}" ../shared/data/tokenizer/tokenizer.model .deps/tokenizer.model)
if [ -z "$tok" ]; then
  echo "note: no Llama-3 tokenizer.model (TOKENIZER_MODEL, ../shared/data/tokenizer, .deps): parquet inputs not checked"
  echo "$pass passed, $fail failed"; exit 0
fi
TOK=(./train tokenize --tokenizer "$tok" --zstd 0)

if ! grep -q '^PARQUET_BUILD := 1' build/deps.mk 2>/dev/null; then
  printf 'PAR1' >"$tmp/x.parquet"
  out=$("${TOK[@]}" --input "$tmp/x.parquet" --output "$tmp/x" 2>&1); rc=$?
  check "without the parquet reader, a .parquet input is refused, naming the file and saying why" \
    '[ $rc -ne 0 ] && echo "$out" | grep -q "x.parquet: this ./train was built without the parquet reader"'
  echo "note: this build has no parquet reader ($(grep '^PARQUET_WHY' build/deps.mk 2>/dev/null)): the rest is not checked"
  echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi

python3 - "$tmp" README.md docs/*.md <<'PY' || { echo "FAIL: could not write the parquet files (pyarrow)"; exit 1; }
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
d, files = sys.argv[1], sys.argv[2:]
docs = [open(p, encoding="utf-8").read() for p in files]
mix = ["日本語のテキストと English が混ざる。", "emoji 😀🎉 and accents: café, naïve, Ærøskøbing", "עברית ومرحبا بالعالم",
       "Ελληνικά και кириллица", "\u00a0non-breaking\u2009spaces\u3000and ideographic", "tabs\tand\r\nCRLF\n\nlines"]
rows = []
for i, t in enumerate(docs):
    rows += [t, mix[i % len(mix)], None if i % 3 == 0 else "", "Short doc %d." % i]
ids = list(range(len(rows)))
def jsonl(path, texts):  # a null row is an empty document on both sides
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t or ""}) + "\n")
jsonl(d + "/all.jsonl", rows)
body = pa.table({"id": pa.array(ids, pa.int64()), "body": pa.array(rows, pa.string())})
pq.write_table(body, d + "/snappy.parquet", row_group_size=7, data_page_size=4096, compression="snappy")
big = pa.table({"id": pa.array(ids, pa.int64()), "body": pa.array(rows, pa.large_string())})
pq.write_table(big, d + "/zstd.parquet", row_group_size=11, compression="zstd", use_dictionary=False)
pq.write_table(pa.table({"text": pa.array(rows, pa.string())}), d + "/text.parquet", row_group_size=5)
# three inputs for --part, and the same as .jsonl
third = len(rows) // 3
for k in range(3):
    part = rows[k * third:(k + 1) * third] if k < 2 else rows[2 * third:]
    jsonl(d + "/part%d.jsonl" % k, part)
    pq.write_table(pa.table({"body": pa.array(part, pa.string())}), d + "/part%d.parquet" % k, row_group_size=6)
# several MB (several blocks of the reader) for the progress lines
many = (rows * 40)[:4000]
pq.write_table(pa.table({"text": pa.array(many, pa.string())}), d + "/many.parquet", row_group_size=500)
# defects
raw = open(d + "/snappy.parquet", "rb").read()
open(d + "/trunc.parquet", "wb").write(raw[: len(raw) // 2])
open(d + "/notparquet.parquet", "w").write("just text, not parquet\n" * 20)
raw = bytearray(open(d + "/text.parquet", "rb").read())  # the first page header follows the magic "PAR1"
raw[4:60] = bytes(b ^ 0x5A for b in raw[4:60])
open(d + "/badpage.parquet", "wb").write(raw)
print(len(rows), sum(r is None for r in rows), sum(r == "" for r in rows))
PY
nulls_empties=$(python3 -c "import pyarrow.parquet as pq; t = pq.read_table('$tmp/snappy.parquet').column('body').to_pylist(); print(sum(1 for r in t if not r))")

cmp_shards() {  # prefix_a prefix_b: the same shard files, byte for byte, and at least one
  local a=$1 b=$2 n=0 f
  for f in "$a"_*.bin; do [ -e "$f" ] || return 1; cmp -s "$f" "$b${f#"$a"}" || return 1; n=$((n + 1)); done
  [ "$n" -ge 2 ] && [ "$(ls "$b"_*.bin | wc -l)" -eq "$n" ]
}
S=(--val-fraction 0.3 --shard-tokens 3000 --quiet)
"${TOK[@]}" "${S[@]}" --input "$tmp/all.jsonl" --output "$tmp/j/all" >/dev/null 2>&1; r0=$?
out=$("${TOK[@]}" --val-fraction 0.3 --shard-tokens 3000 --text-field body --input "$tmp/snappy.parquet" \
  --output "$tmp/p/snappy" --threads 2 2>&1); r1=$?
check "tokenize: a snappy parquet (text column 'body', 7-row groups, 4 KB pages) gives the .jsonl's shards" \
  '[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && cmp_shards "$tmp/j/all" "$tmp/p/snappy"'
check "null rows and empty strings are skipped as empty documents ($nulls_empties)" \
  'echo "$out" | grep -q " $nulls_empties empty docs skipped"'
"${TOK[@]}" "${S[@]}" --text-field body --input "$tmp/zstd.parquet" --output "$tmp/p/zstd" --threads 1 >/dev/null 2>&1
check "a zstd parquet of large_string without dictionary, on one thread, likewise" 'cmp_shards "$tmp/j/all" "$tmp/p/zstd"'
"${TOK[@]}" "${S[@]}" --input "$tmp/text.parquet" --output "$tmp/p/text" >/dev/null 2>&1
check "the column named text is read without --text-field" 'cmp_shards "$tmp/j/all" "$tmp/p/text"'

# Several inputs, --part I/N: the parquet parts give the jsonl parts' shards
rp=0
for k in 0 1; do
  "${TOK[@]}" "${S[@]}" --input "$tmp/part0.jsonl" --input "$tmp/part1.jsonl" --input "$tmp/part2.jsonl" \
    --part "$k/2" --output "$tmp/j/parts" >/dev/null 2>&1 || rp=1
  "${TOK[@]}" "${S[@]}" --text-field body --input "$tmp/part0.parquet" --input "$tmp/part1.parquet" \
    --input "$tmp/part2.parquet" --part "$k/2" --output "$tmp/p/parts" >/dev/null 2>&1 || rp=1
done
check "three parquet inputs in --part 0/2 and 1/2 give the shards of the same .jsonl inputs" \
  '[ $rp -eq 0 ] && cmp_shards "$tmp/j/parts" "$tmp/p/parts" && ls "$tmp"/p/parts_train_p001_* >/dev/null'
"${TOK[@]}" "${S[@]}" --text-field body --input "$tmp/part0.parquet" --input "$tmp/part1.parquet" \
  --input "$tmp/part2.parquet" --output "$tmp/p/three" >/dev/null 2>&1
"${TOK[@]}" "${S[@]}" --input "$tmp/part0.jsonl" --input "$tmp/part1.jsonl" --input "$tmp/part2.jsonl" \
  --output "$tmp/j/three" >/dev/null 2>&1
check "three parquet inputs in one call give the three .jsonl inputs' shards" 'cmp_shards "$tmp/j/three" "$tmp/p/three"'

out=$(TOKENIZE_REPORT_S=0 "${TOK[@]}" --input "$tmp/many.parquet" --output "$tmp/p/many" 2>&1 >/dev/null)
check "progress lines over a parquet input give the share of it read and an ETA" \
  'echo "$out" | grep -Eq "tokenize: [0-9]+ docs, .* [0-9.]+% of [0-9.]+ MB of input, eta [0-9]+h[0-9]{2}m[0-9]{2}s"'

refused() {  # input, extra args...: fails and names the input
  local in=$1; shift
  out=$("${TOK[@]}" --input "$in" --output "$tmp/x/r" "$@" 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "$in"
}
check "a parquet file without the column is refused, naming the file, the column and its columns" \
  'refused "$tmp/snappy.parquet" && echo "$out" | grep -q "no column \"text\" (its columns: id, body)"'
check "an int column is refused, naming the file and the column's type" \
  'refused "$tmp/snappy.parquet" --text-field id && echo "$out" | grep -q "column \"id\" holds INT64, not strings"'
check "a truncated parquet file is refused, naming it" \
  'refused "$tmp/trunc.parquet" --text-field body && echo "$out" | grep -q "cannot read it as parquet"'
check "a corrupt page is refused, naming the file and the column" \
  'refused "$tmp/badpage.parquet" && echo "$out" | grep -q "badpage.parquet: column \"text\", row group 0: "'
check "a file that is not parquet is refused, naming it" \
  'refused "$tmp/notparquet.parquet" && echo "$out" | grep -q "cannot read it as parquet"'
check "a bad file after a good one is refused before any shard is written" \
  '! "${TOK[@]}" --input "$tmp/text.parquet" --input "$tmp/trunc.parquet" --output "$tmp/x/early" >/dev/null 2>&1 &&
   ! ls "$tmp"/x/early_* >/dev/null 2>&1'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
