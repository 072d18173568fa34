// The little JSON the tokenizer reads: encoder.json (one object of string -> integer) and JSON-lines
// datasets (one object per line, of which prepro wants one string field).
//
// Design: a cursor over bytes in memory, no tree. Each reader returns false with `error` set instead
// of exiting, because only the caller knows what to name in the message (the encoder file and a byte
// offset, or a dataset file and a line number). Strings come out as UTF-8; a \uXXXX escape that is a
// lone surrogate (invalid in UTF-8, legal in JSON) comes out as its 3-byte WTF-8 form, which the
// encoder then treats as bytes that are not valid UTF-8 rather than losing it.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

struct BpeJsonCursor {
    const char* pos;
    const char* end;
    const char* error = nullptr;  // set by the first reader that fails
};

inline bool bpe_json_fail(BpeJsonCursor* c, const char* message) {
    if (c->error == nullptr) c->error = message;
    return false;
}

inline void bpe_json_skip_space(BpeJsonCursor* c) {
    while (c->pos < c->end && (*c->pos == ' ' || *c->pos == '\t' || *c->pos == '\n' || *c->pos == '\r')) {
        c->pos++;
    }
}

// Consumes `ch` (after optional whitespace) if it is next; returns whether it was.
inline bool bpe_json_accept(BpeJsonCursor* c, char ch) {
    bpe_json_skip_space(c);
    if (c->pos < c->end && *c->pos == ch) {
        c->pos++;
        return true;
    }
    return false;
}

inline void bpe_utf8_append(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back((char)cp);
    } else if (cp < 0x800) {
        out->push_back((char)(0xC0 | (cp >> 6)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | (cp >> 12)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | (cp >> 18)));
        out->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

inline bool bpe_json_read_hex4(BpeJsonCursor* c, uint32_t* value) {
    if (c->end - c->pos < 4) return bpe_json_fail(c, "truncated \\u escape");
    *value = 0;
    for (int i = 0; i < 4; i++) {
        char h = *c->pos++;
        int digit = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (digit < 0) return bpe_json_fail(c, "bad hex digit in \\u escape");
        *value = *value * 16 + (uint32_t)digit;
    }
    return true;
}

// Reads a JSON string (after optional whitespace) into `out` as UTF-8.
inline bool bpe_json_read_string(BpeJsonCursor* c, std::string* out) {
    out->clear();
    if (!bpe_json_accept(c, '"')) return bpe_json_fail(c, "expected a string");
    while (c->pos < c->end) {
        char ch = *c->pos++;
        if (ch == '"') return true;
        if (ch != '\\') {
            out->push_back(ch);
            continue;
        }
        if (c->pos >= c->end) break;
        char esc = *c->pos++;
        switch (esc) {
            case '"': out->push_back('"'); break;
            case '\\': out->push_back('\\'); break;
            case '/': out->push_back('/'); break;
            case 'b': out->push_back('\b'); break;
            case 'f': out->push_back('\f'); break;
            case 'n': out->push_back('\n'); break;
            case 'r': out->push_back('\r'); break;
            case 't': out->push_back('\t'); break;
            case 'u': {
                uint32_t cp;
                if (!bpe_json_read_hex4(c, &cp)) return false;
                // a high surrogate followed by an escaped low surrogate is one code point
                if (cp >= 0xD800 && cp < 0xDC00 && c->end - c->pos >= 6 && c->pos[0] == '\\' && c->pos[1] == 'u') {
                    BpeJsonCursor low_cursor = {c->pos + 2, c->end};
                    uint32_t low;
                    if (bpe_json_read_hex4(&low_cursor, &low) && low >= 0xDC00 && low < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                        c->pos = low_cursor.pos;
                    }
                }
                bpe_utf8_append(out, cp);
                break;
            }
            default: return bpe_json_fail(c, "unknown escape in string");
        }
    }
    return bpe_json_fail(c, "unterminated string");
}

// Reads an integer (no fraction or exponent), as encoder.json's token ids are.
inline bool bpe_json_read_int(BpeJsonCursor* c, long* value) {
    bpe_json_skip_space(c);
    const char* start = c->pos;
    if (c->pos < c->end && *c->pos == '-') c->pos++;
    if (c->pos >= c->end || *c->pos < '0' || *c->pos > '9') return bpe_json_fail(c, "expected an integer");
    long v = 0;
    while (c->pos < c->end && *c->pos >= '0' && *c->pos <= '9') {
        if (v > 1000000000L) return bpe_json_fail(c, "integer out of range");
        v = v * 10 + (*c->pos++ - '0');
    }
    if (c->pos < c->end && (*c->pos == '.' || *c->pos == 'e' || *c->pos == 'E')) {
        return bpe_json_fail(c, "expected an integer, found a fraction");
    }
    *value = (*start == '-') ? -v : v;
    return true;
}

// Skips one JSON value of any kind. Open containers are kept on an explicit stack, not the call
// stack, so a hostile line of a million '[' cannot overflow it.
inline bool bpe_json_skip_value(BpeJsonCursor* c) {
    std::string open;  // '{' or '[' for each container we are inside
    std::string scratch;
    for (;;) {
        // at the start of a value
        bpe_json_skip_space(c);
        if (c->pos >= c->end) return bpe_json_fail(c, "unexpected end of input");
        char ch = *c->pos;
        if (ch == '{' || ch == '[') {
            c->pos++;
            if (!bpe_json_accept(c, ch == '{' ? '}' : ']')) {
                open.push_back(ch);
                if (ch == '{' && !(bpe_json_read_string(c, &scratch) && bpe_json_accept(c, ':'))) {
                    return bpe_json_fail(c, "expected \"key\": in an object");
                }
                continue;  // read the first member
            }
        } else if (ch == '"') {
            if (!bpe_json_read_string(c, &scratch)) return false;
        } else {
            // number, true, false or null: a run of these characters
            const char* start = c->pos;
            while (c->pos < c->end && (isalnum((unsigned char)*c->pos) || *c->pos == '-' || *c->pos == '+' ||
                                        *c->pos == '.')) {
                c->pos++;
            }
            if (c->pos == start) return bpe_json_fail(c, "unexpected character where a value should be");
        }
        // a value has ended: close finished containers, or step to the next member
        for (;;) {
            if (open.empty()) return true;
            if (bpe_json_accept(c, open.back() == '{' ? '}' : ']')) {
                open.pop_back();
                continue;
            }
            if (!bpe_json_accept(c, ',')) return bpe_json_fail(c, "expected ',' or a closing bracket");
            if (open.back() == '{' && !(bpe_json_read_string(c, &scratch) && bpe_json_accept(c, ':'))) {
                return bpe_json_fail(c, "expected \"key\": in an object");
            }
            break;
        }
    }
}

// Reads one JSON-lines record: an object, of which the string member `field` is returned in `value`.
// Other members are skipped; a missing field or one that is not a string is an error.
inline bool bpe_json_read_object_field(BpeJsonCursor* c, const std::string& field, std::string* value) {
    if (!bpe_json_accept(c, '{')) return bpe_json_fail(c, "expected an object");
    std::string key;
    bool found = false;
    if (!bpe_json_accept(c, '}')) {
        do {
            if (!bpe_json_read_string(c, &key) || !bpe_json_accept(c, ':')) return bpe_json_fail(c, "expected \"key\": in an object");
            bpe_json_skip_space(c);
            if (key == field && !found) {
                if (c->pos >= c->end || *c->pos != '"') return bpe_json_fail(c, "the field is not a string");
                if (!bpe_json_read_string(c, value)) return false;
                found = true;
            } else if (!bpe_json_skip_value(c)) {
                return false;
            }
        } while (bpe_json_accept(c, ','));
        if (!bpe_json_accept(c, '}')) return bpe_json_fail(c, "expected ',' or '}' in an object");
    }
    if (!found) return bpe_json_fail(c, "the field is missing");
    return true;
}
