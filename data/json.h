// data/json.h: just enough JSON for .jsonl corpora: pull one string field out of an object.
#pragma once
#include <stddef.h>

// Parses text[0..len) as one JSON object (full syntax check: nested objects, arrays, numbers,
// literals) and decodes the string value of its top-level member `key` to UTF-8. All escapes are
// handled, \uXXXX surrogate pairs included; a lone surrogate becomes U+FFFD. Raw control bytes
// inside strings are accepted (lenient, as many corpora have stray tabs). With duplicate keys the
// last one wins, as in Python's json.
// Returns 1 with *out (malloc'd, NUL-terminated; caller frees) and *out_len; 0 if the object has
// no such member; -1 on a syntax error or a non-string value, with "column N: reason" in err.
int json_get_string(const char *text, size_t len, const char *key, char **out, size_t *out_len, char *err,
                    size_t errlen);
