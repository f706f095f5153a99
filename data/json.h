// data/json.h: just enough JSON for .jsonl corpora (one string field out of an object) and small
// manifests (any member's raw value, the elements of an array).
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

// The raw value of top-level member `key` of the object text[0..len): [*start, *end). 1 found, 0 not,
// -1 on a syntax error (err as above).
int json_member_span(const char *text, size_t len, const char *key, size_t *start, size_t *end, char *err,
                     size_t errlen);
// The elements of an array text[0..len) (text at its '['): call with *pos = 0, then again; each call
// gives the next element's raw span and returns 1, 0 after the last, -1 on a syntax error.
int json_array_next(const char *text, size_t len, size_t *pos, size_t *start, size_t *end, char *err, size_t errlen);
