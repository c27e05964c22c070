#!/usr/bin/env python3
"""Writes the tokenizer comparison corpus: one JSON string a line.

The corpus (tests/data/tokenizers/corpus.jsonl) was generated once by this
script and is frozen: the reference ids in tests/data/tokenizers/ were made
from it. Rerunning it with the same seed gives the same file; changing it
means regenerating every <family>.ref.jsonl (tools/tokref/reference.mjs).
The NFD/NFKC variants depend on the Unicode version of the Python that
ran it (3.11, Unicode 14.0), another reason the file is frozen.

    python3 tools/tokref/make_corpus.py > tests/data/tokenizers/corpus.jsonl
"""
import json
import random
import sys
import unicodedata

SEED = 20240611

# Hand-written lines, by topic.
SCRIPTS = [
    "日本語のテキストと漢字かな交じり文。",
    "ひらがなだけのぶんしょうです",
    "カタカナ　デ　カイタ　ブンショウ",
    "ｶﾀｶﾅ ﾊﾝｶｸ ﾓｼﾞ",
    "中文文本：我们今天去公园散步，天气很好。",
    "繁體中文：這是一個測試句子。",
    "한국어 문장입니다. 안녕하세요!",
    "한글 자모: ᄀ ᅡ ᆨ (conjoining jamo)",
    "مرحبا بالعالم، هذا نص عربي.",
    "العربية مع أرقام ١٢٣٤٥ و 12345",
    "שלום עולם, זהו טקסט בעברית.",
    "עברית עם ניקוד: שָׁלוֹם",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "संस्कृतम् क्षत्रिय ज्ञान",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Γειά σου Κόσμε, αυτό είναι ελληνικό κείμενο.",
    "ΑΒΓΔ αβγδ ς σ Σ",
    "Привет, мир! Это русский текст.",
    "Українська мова: їжак, ґанок, є.",
    "Tiếng Việt có dấu: Xin chào thế giới, người Việt Nam.",
    "Tiếng Việt dựng sẵn: ắ ằ ẳ ẵ ặ ố ồ ổ ỗ ộ",
    "Ελληνικά με τόνους: άέήίόύώ ϊϋΐΰ",
    "ქართული ენა",
    "Հայերեն լեզու",
    "አማርኛ ቋንቋ",
    "தமிழ் மொழி",
    "বাংলা ভাষা",
    "ਪੰਜਾਬੀ ਭਾਸ਼ਾ",
    "ລາວ ພາສາ",
    "မြန်မာဘာသာ",
    "ខ្មែរ",
    "Türkçe: ığüşöç İĞÜŞÖÇ",
    "Polski: zażółć gęślą jaźń",
    "Deutsch: Größe, Straße, Fußgängerübergänge",
    "Français : « guillemets » et l'apostrophe’s",
    "Español: ¿Qué tal? ¡Muy bien! año, niño",
    "Norsk: blåbærsyltetøy",
    "Íslenska: þetta er ð",
]

# Precomposed (NFC) and decomposed (NFD) forms, and compatibility forms
# (NFKC folds them).
NORMALIZATION = [
    "café", "cafe\u0301", "Ångström", "A\u030angstro\u0308m",
    "naïve façade résumé", "nai\u0308ve fac\u0327ade re\u0301sume\u0301",
    "Việt Nam", "Vie\u0323\u0302t Nam", "Viê\u0323t Nam",
    "ñ vs n\u0303", "ǅ ǆ Ǆ", "ﬁ ﬂ ﬀ ﬃ ﬄ ligatures: ﬁnance",
    "ＦＵＬＬＷＩＤＴＨ　ｆｕｌｌｗｉｄｔｈ　１２３", "（全角括号）！？",
    "① ② ③ ⑩ ⅰ ⅱ Ⅻ", "x² y³ H₂O ½ ¼ ¾", "™ ℠ ℃ ℉ № ㎏ ㎞ ㍻",
    "Å (angstrom sign) vs Å", "Ω (ohm) vs Ω", "ｱｲｳｴｵ halfwidth",
    "\u1100\u1161\u11a8 (jamo) vs 각", "e\u0301\u0301\u0301 stacked marks",
    "Z\u0351\u0352\u0353a\u0354\u0355l\u0356\u0357g\u0358o\u0359",
    "\u00a0no-break\u00a0space\u202fnarrow\u2009thin\u3000ideographic",
    "soft\u00adhyphen zero\u200bwidth\u200cnon\u200djoiner",
    "\ufeffbyte order mark at start", "left\u200eto\u200fright marks",
    "ſ long s, ﬅ, ẞ capital sharp s",
]

EMOJI = [
    "🎉🚀✨", "👍👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦 family", "👩🏽‍💻 technologist",
    "🏳️‍🌈 🏴‍☠️", "🇺🇸🇯🇵🇩🇪🇫🇷🇧🇷", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
    "❤️ ❤ ♥️ 💔", "1️⃣ 2️⃣ #️⃣ *️⃣", "😀😃😄😁😆😅😂🤣", "🧑‍🤝‍🧑 🤝🏿",
    "text with emoji in the middle 🤔 and after.", "🙂", "🫠🫶🪿",
    "👁️‍🗨️", "☕️ coffee ☕", "emoji🎉glued🎉to🎉words",
]

WHITESPACE = [
    "", " ", "  ", "   ", "          ", "\t", "\t\t", "\n", "\n\n", "\n\n\n",
    "\r\n", "\r\n\r\n", "\r", " \n ", "\t \n \t", "a  b   c    d     e",
    "  leading spaces", "trailing spaces   ", "  both  ", "\tleading tab",
    "trailing tab\t", "\nleading newline", "trailing newline\n",
    "line one\nline two\nline three", "crlf one\r\ncrlf two\r\n",
    "mixed \t\n\r\n  \t whitespace", "word\n\n\n\nword", "tab\tseparated\tvalues",
    "    indented by four", "\t\tindented by tabs", " " * 40 + "x",
    "x" + " " * 33, "\n" * 12, "a\u000bb\u000cc", "a\u0085b (NEL)",
    "a\u2028b\u2029c (line and paragraph separators)", "a\u0000b", "\u0000",
    "bell\u0007 and escape\u001b[0m", "del\u007fchar",
]

CODE = [
    "#include <stdio.h>\n\nint main(void)\n{\n    printf(\"hello\\n\");\n    return 0;\n}\n",
    "static int add(int a, int b) { return a + b; } /* sum */",
    "for (size_t i = 0; i < n; i++) {\n\tx[i] = y[i] * 2.0f;\n}",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\nx = np.arange(10) ** 2  # squares",
    "class Foo(Base):\n    def __init__(self, *args, **kwargs):\n        super().__init__()",
    "print(f\"{name!r:>10} = {value:.3f}\")",
    "lambda x: [y for y in x if y % 2 == 0]",
    "{\"key\": \"value\", \"n\": 42, \"list\": [1, 2.5, null, true, false]}",
    "{\n  \"nested\": {\n    \"a\": [\n      {}\n    ]\n  }\n}",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><title>Test</title></head>\n<body><p class=\"x\">Hi &amp; bye</p></body>\n</html>",
    "<div id=\"main\" style=\"color: red;\"><br/><img src=\"a.png\" alt=\"\"></div>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "const f = async (x) => { await g(x); return x?.y ?? 0; };",
    "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }",
    "$ ls -la | grep '\\.c$' | wc -l && echo \"done\" > /dev/null 2>&1",
    "x += 1; y -= 2; z *= 3; w /= 4; q %= 5; a <<= 1; b >>= 2; c ^= d;",
    "if (a == b && c != d || !e) { ++i; --j; }",
    "std::vector<std::map<int, std::string>> v; // templates",
    "    \n    \n",
    "a_b_c snake_case camelCaseWord PascalCase SCREAMING_CASE kebab-case",
    "0x7fffffff 0b1010 0o777 1e-9 6.02e23 3.14f 42ULL",
    "// comment\n/* block */\n# hash\n-- dash",
    "```python\nprint('fenced')\n```",
]

NUMBERS = [
    "0", "1", "12", "123", "1234", "12345", "123456789012345678901234567890",
    "3.14159265358979323846", "-42", "+7", "1,000,000", "1.000.000,50",
    "2024-06-11T12:34:56Z", "12:30pm", "$100.00 €50 £20 ¥1000 ₹500",
    "50% off, 3/4 cup, 1:2 ratio", "version 1.2.3-rc.4+build.5",
    "phone: +1 (555) 123-4567", "IPv4 192.168.0.1 IPv6 ::1 fe80::1%eth0",
    "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ 〇一二三", "１２３４５ fullwidth digits",
    "1st 2nd 3rd 4th 21st", "1e10 1E-10 .5 5. 0.0", "999999999999999999999",
]

URLS = [
    "https://example.com/path/to/page?query=1&x=y#frag",
    "http://user:pass@host.example.org:8080/a%20b",
    "ftp://files.example.net/pub/file.tar.gz",
    "mailto:someone@example.com", "www.example.co.uk/index.html",
    "see https://en.wikipedia.org/wiki/Tokenization_(lexical_analysis) for more",
    "git@github.com:owner/repo.git", "file:///home/user/doc.txt",
    "https://例え.jp/パス", "C:\\Program Files\\App\\app.exe",
    "/usr/local/lib/libfoo.so.1.2", "user@example.com, other+tag@mail.example",
]

SPECIALS = [
    "<s>", "</s>", "<s> hello </s>", "<unk>", "<pad>", "<bos>", "<eos>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|begin_of_text|>Hello",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "text<|endoftext|>more text",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>", "<end_of_turn>", "<0x41>", "<0x0A>", "<0xFF><0x00>",
    "▁", "▁▁▁", "▁hello▁world", "hello ▁ world", "Ġ Ċ ĉ (byte-level look-alikes)",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<think>\nreasoning\n</think>",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "<|vision_start|><|image_pad|><|vision_end|>",
    "< s > <s > < /s> <|im_start |> <| endoftext |>", "<<s>> <</s>>", "<|begin_of_text",
    "begin_of_text|>", "<|reserved_special_token_0|>", "<mask> [MASK] [CLS] [SEP]",
    "<|endoftext|><|endoftext|>", " <s>", "<s> ", "</s></s></s>",
    "<start_of_image>", "<|python_tag|>", "<|eom_id|>",
]

LONG = [
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
    "supercalifragilisticexpialidocious" * 3,
    "a" * 500, "ab" * 300, "x" * 1500, "." * 200, "-" * 120, "=" * 80,
    "!!!???!!!", "...", "…", "—–-", "hello" * 50, "😀" * 100, "日" * 300,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
    "tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, "
    "quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo "
    "consequat.",
    "The quick brown fox jumps over the lazy dog. " * 8,
    "ThisIsAVeryLongCamelCaseIdentifierThatKeepsGoingAndGoingForeverAndEver",
    "0123456789" * 20,
]

PROSE = [
    "Hello world", "Hello, world!", "hello world", "HELLO WORLD", "Hello World",
    "I'm", "you're", "they'll", "we've", "she'd", "it's", "don't", "DON'T",
    "I'M YOU'RE THEY'LL", "O'Neil's", "rock 'n' roll", "'quoted' \"double\"",
    "The year 1999 was fun.", "Mr. Smith went to Washington.",
    "e.g. i.e. etc. vs. a.m.", "A.B.C.", "(parentheses) [brackets] {braces}",
    "semi;colon: comma, period. question? exclaim!", "a-b a–b a—b",
    "“curly quotes” ‘single’ „low“ ‹angle›", "#hashtag @mention $cash %pct ^caret &amp *star",
    "~tilde `backtick` |pipe| \\backslash/", "Capitalized Words In A Title",
    "newline-separated\nsentences here.\nAnd here.", "tabs\tin\tthe\tmiddle",
    "multiple   spaces   between   words", " a", " ab", " abc", "a ", "a b",
]


def fuzz_codepoints(rng, n):
    """Random code points: ASCII, BMP and astral planes, no surrogates."""
    out = []
    for _ in range(n):
        length = rng.randint(1, 40)
        chars = []
        for _ in range(length):
            r = rng.random()
            if r < 0.3:
                cp = rng.randint(0x20, 0x7e)
            elif r < 0.4:
                cp = rng.choice([0x20, 0x20, 0x09, 0x0a, 0x0d, 0x3000, 0xa0])
            elif r < 0.75:
                cp = rng.randint(0xa0, 0xffff)
            else:
                cp = rng.randint(0x10000, 0x10ffff)
            if 0xd800 <= cp <= 0xdfff:
                cp -= 0x800
            chars.append(chr(cp))
        out.append("".join(chars))
    return out


def fuzz_bytes(rng, n):
    """Random bytes made valid UTF-8 (what does not decode becomes U+FFFD)."""
    out = []
    for _ in range(n):
        raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 48)))
        out.append(raw.decode("utf-8", errors="replace"))
    return out


def fuzz_words(rng, n):
    """Random runs of words, digits, punctuation and white space."""
    pieces = ["the", "a", "tok", "en", "izer", "123", "4", "'s", "'t", "'re", "  ",
              " ", "\t", "\n", "\r\n", ",", ".", "!", "?", "é", "日本", "한", "🎉",
              "<s>", "▁", "x", "Q", "über", "ß", "ﬁ", "\u0301", "-", "_", "$", "%"]
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 25))))
    return out


def main():
    rng = random.Random(SEED)
    lines = (SCRIPTS + NORMALIZATION + EMOJI + WHITESPACE + CODE + NUMBERS + URLS
             + SPECIALS + LONG + PROSE)
    # Each script line also in NFD and NFKC where that changes it.
    for s in SCRIPTS + NORMALIZATION:
        for form in ("NFD", "NFKC"):
            t = unicodedata.normalize(form, s)
            if t != s and t not in lines:
                lines.append(t)
    lines += fuzz_codepoints(rng, 60)
    lines += fuzz_bytes(rng, 40)
    lines += fuzz_words(rng, 60)
    for s in lines:
        sys.stdout.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"{len(lines)} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
