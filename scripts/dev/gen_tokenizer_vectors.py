#!/usr/bin/env python3
"""Generates tests/data/tokenizer_vectors.txt: reference Llama-3 token ids from tiktoken.

The encoding is built from the shared tokenizer files (no download). Each output line is one case:

    KIND <TAB> ESCAPED_TEXT <TAB> IDS

KIND is "text" (valid UTF-8: decode(encode(x)) must give x back) or "bytes" (invalid UTF-8: the
reference ids are tiktoken's on bytes.decode("utf-8", "replace"), which is what the C tokenizer
documents). ESCAPED_TEXT uses \\\\ \\t \\n \\r and \\xHH (control bytes, and every byte >= 0x80 of
a "bytes" case); other UTF-8 is written raw. IDS are space-separated (empty for the empty string).

Usage: python3 scripts/dev/gen_tokenizer_vectors.py [--shared ../shared] [--out tests/data/tokenizer_vectors.txt]
"""
import argparse
import json
import os
import random

import tiktoken
import tiktoken.load


def special_tokens(n_ranks):
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
             "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    names += [f"<|reserved_special_token_{i}|>" for i in range(3, 256 - len(names) + 3)]
    assert len(names) == 256
    return {name: n_ranks + i for i, name in enumerate(names)}


ESCAPES = {0x5C: b"\\\\", 0x09: b"\\t", 0x0A: b"\\n", 0x0D: b"\\r"}


def escape(b: bytes, all_high: bool) -> str:
    out = bytearray()
    for c in b:
        if c in ESCAPES:
            out += ESCAPES[c]
        elif c < 0x20 or c == 0x7F or (all_high and c >= 0x80):
            out += b"\\x%02x" % c
        else:
            out.append(c)  # raw; the line stays valid UTF-8 whenever the input was
    return out.decode("utf-8")


def read_novels(path):
    try:
        import zstandard as zstd
        with open(path, "rb") as f:
            data = zstd.ZstdDecompressor().stream_reader(f).read()
    except ImportError:
        import subprocess
        data = subprocess.run(["zstdcat", path], check=True, capture_output=True).stdout
    return [json.loads(line)["text"] for line in data.split(b"\n") if line.strip()]


def fixed_cases():
    return [
        "This is a test sentence.",
        "",
        # contractions, all cases; 'ſ (long s) case-folds to 's in Unicode
        "I'm sure he's done; they'll say we've, you'd, it's, don't, I'd've.",
        "HE'S THEY'LL I'M DON'T WE'VE YOU'D 'S 'T 'RE",
        "He'S It'Ll 'sup 'twas rock'n'roll ''s ’s it’s",
        "it'ſ it'ſt o'K we'ſ'd",
        # numbers
        "1 12 123 1234 12345 123456789 3.14159 1,000,000 -42 +7 1e10 0x1F 2024-06-01",
        "Arabic-Indic ١٢٣٤٥ Devanagari १२३४ superscripts x²³ roman Ⅻ fractions ½¾ circled ①②",
        # punctuation runs
        "Wait!!! What??? ... ---- ==== !!?! (((nested))) {[<>]} «quotes» “curly” 'single'",
        "a!!\n\nb ...\n\n\n--\r\n",
        # newlines and whitespace
        "line1\r\nline2\r\n\r\nline3\n\n\nline4\rline5",
        "a  b   c    d     e",
        "trailing spaces   ",
        "   leading spaces",
        "\t\ttabs\tand spaces \t mixed\t",
        " \n \n\n  \n",
        "a \n\n b\n \nc",
        "\n",
        " ",
        "      ",
        "\u00a0nbsp a\u00a0b\u3000ideographic\u2003em\u0085nel\u2028ls\u2029ps\u200bzwsp\ufeffbom\u000bvt\u000cff",
        "a\u0000b\u0001c\u007fd",
        # U+180E is not White_Space in Unicode (PCRE2's \s would say it is); \x1c..\x1f neither
        "=\u180eF a\u180e b \u180e\u180e x\u180e\n\u180e \x1c\x1d\x1e\x1f sep",
        # scripts
        "Café naïve façade Übermaß Ærøskøbing São Paulo Łódź İstanbul ß ẞ ǅ",
        "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
        "Русский язык: Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "中文：我们在北京的大学学习计算机科学。人工智能正在改变世界。",
        "日本語：私はカタカナとひらがなと漢字を使います。東京タワーは高い！",
        "한국어: 다람쥐 헌 쳇바퀴에 타고파. 안녕하세요, 세계!",
        "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر.",
        "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
        "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า עברית: דג סקרן שט בים מאוכזב",
        "combining: e\u0301 a\u0308 n\u0303 \u0301\u0301 Z\u0351\u0352\u0353\u0354",
        # emoji
        "😀 😃😄 👍🏽 ❤️ ✨🔥 1️⃣ #️⃣",
        "family 👨‍👩‍👧‍👦 couple 👩‍❤️‍💋‍👨 technologist 🧑🏿‍💻",
        "flags 🇺🇸🇫🇷🇯🇵 🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏳️‍🌈",
        # code
        "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
        "int main(void) {\n\tfor (int i = 0; i < 10; i++) printf(\"%d\\n\", i);\n\treturn 0;\n}\n",
        '{"key": [1, 2.5, null, true], "nested": {"a": "b\\u00e9"}}',
        "<html><body class=\"x\"><p>Hello&nbsp;world &amp; friends</p></body></html>",
        "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
        "https://example.com/path?query=value&other=123#fragment user@example.org",
        # special-token strings are plain text for ordinary encoding
        "<|begin_of_text|>Hello<|end_of_text|>",
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|reserved_special_token_250|>",
        # long pieces (the BPE must not be quadratic)
        " " * 10000 + "x",
        "\n" * 3000,
        "a" * 5000,
        "=" * 4000 + "\n",
        "🙂" * 500,
        "-" * 77 + " " + "_" * 129,
        "1234567890" * 50,
    ]


def fuzz_cases(rng, n):
    """Random strings over character classes where regex engines tend to disagree."""
    pools = [
        "abcxyzABCXYZ", "0123456789", " ", "  \t", "\n", "\r\n", "'", "'s'S'll'LL'd've're'm'tſK",
        ".,;:!?-_()[]{}<>\"/\\|@#$%^&*+=~`", "éèüßÆøñçÅ", "αβγΔΩ", "жщЯЁ", "中文字漢",
        "カタかな", "한글", "عربي", "हिन्दी", "\u0301\u0308\u0351", "\u00a0\u2003\u3000\u0085\u2028",
        "\u200b\u200d\ufeff", "😀👍🏽🇺🇸❤️", "١٢٣४५", "²½Ⅻ", "\u000b\u000c",
    ]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 40)):
            pool = rng.choice(pools)
            s.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 4))))
        out.append("".join(s))
    return out


def invalid_cases(rng):
    cases = [
        b"abc\xffdef",
        b"\xe2\x82",              # truncated 3-byte sequence at the end
        b"x\xe2\x82y",            # truncated in the middle
        b"\xc0\x80 overlong",     # C0/C1 never valid
        b"\xed\xa0\x80 surrogate",
        b"\xf4\x90\x80\x80 too big",
        b"\xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80",
        b"\x80\x80\x80 stray continuations",
        b"caf\xe9 latin-1",
        b"\xfe\xff\xfe",
    ]
    for _ in range(10):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 60))))
    return cases


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "..", "shared"))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data", "tokenizer_vectors.txt"))
    args = ap.parse_args()

    tok_dir = os.path.join(args.shared, "data", "tokenizer")
    ranks = tiktoken.load.load_tiktoken_bpe(os.path.join(tok_dir, "tokenizer.model"))
    with open(os.path.join(tok_dir, "pat_str.txt")) as f:
        pat = f.read()
    enc = tiktoken.Encoding(name="llama3", pat_str=pat, mergeable_ranks=ranks,
                            special_tokens=special_tokens(len(ranks)))
    assert enc.n_vocab == 128256

    rng = random.Random(1234)
    texts = fixed_cases()
    with open(os.path.join(args.shared, "data", "corpus", "tiny_shakespeare.txt"), encoding="utf-8") as f:
        texts.append(f.read()[:3000])
    novels = read_novels(os.path.join(args.shared, "data", "corpus", "novels.jsonl.zst"))
    for _ in range(6):
        doc = rng.choice(novels)
        start = rng.randrange(max(1, len(doc) - 2000))
        texts.append(doc[start:start + rng.randint(300, 2000)])
    texts += fuzz_cases(rng, 150)

    lines = []
    for t in texts:
        ids = enc.encode_ordinary(t)
        lines.append("text\t%s\t%s" % (escape(t.encode("utf-8"), False), " ".join(map(str, ids))))
    for b in invalid_cases(rng):
        ids = enc.encode_ordinary(b.decode("utf-8", "replace"))
        lines.append("bytes\t%s\t%s" % (escape(b, True), " ".join(map(str, ids))))

    assert enc.encode_ordinary("This is a test sentence.") == [2028, 374, 264, 1296, 11914, 13]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d cases, %d bytes to %s" % (len(lines), os.path.getsize(args.out), args.out))


if __name__ == "__main__":
    main()
