// Reference ids for test/test_tokenizer.cpp from gpt-3-encoder's Encoder.js, an independent GPT-2
// encoder in JavaScript (`npm pack gpt-3-encoder`; the test unpacks it into build/gpt-3-encoder).
//
//   node test/tokenizer_oracle.js ENCODER_DIR RECORDS_IN IDS_OUT
//
// RECORDS_IN holds texts as records: uint32 little-endian byte length, then that many bytes of UTF-8.
// IDS_OUT gets one line per record: its token ids, separated by spaces.
//
// Encoder.js builds its output with Array.concat once per pre-token, which is quadratic in the length
// of a text (all of tinyshakespeare would take hours). So a long text is handed to it in chunks, cut
// only right after a pre-token that ends in a non-whitespace character. Such a cut cannot change any
// pre-token: no part of GPT-2's pattern looks behind, and only `\s+(?!\S)` looks ahead, which matters
// only while a match is still in whitespace. Merges never cross pre-tokens. So the chunks' ids, joined,
// are the whole text's ids.
'use strict';
const fs = require('fs');
const path = require('path');

const [encoderDir, recordsIn, idsOut] = process.argv.slice(2);
if (!idsOut) {
  console.error('usage: node tokenizer_oracle.js ENCODER_DIR RECORDS_IN IDS_OUT');
  process.exit(2);
}
const { encode } = require(path.resolve(encoderDir, 'Encoder.js'));

// GPT-2's pre-tokenizer pattern, as Encoder.js writes it (used here only to find safe cut points).
const pattern = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const CHUNK_CHARS = 4096;

function encodeLong(text) {
  if (text.length <= CHUNK_CHARS) return encode(text);
  const ids = [];
  let chunkStart = 0;
  for (const match of text.matchAll(pattern)) {
    const end = match.index + match[0].length;
    if (end - chunkStart >= CHUNK_CHARS && /\S$/u.test(match[0])) {
      for (const id of encode(text.slice(chunkStart, end))) ids.push(id);
      chunkStart = end;
    }
  }
  if (chunkStart < text.length) {
    for (const id of encode(text.slice(chunkStart))) ids.push(id);
  }
  return ids;
}

const data = fs.readFileSync(recordsIn);
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
const lines = [];
for (let pos = 0; pos < data.length;) {
  if (pos + 4 > data.length) throw new Error(`truncated record header at byte ${pos}`);
  const length = data.readUInt32LE(pos);
  pos += 4;
  if (pos + length > data.length) throw new Error(`truncated record at byte ${pos}`);
  const text = decoder.decode(data.subarray(pos, pos + length));
  pos += length;
  const ids = encodeLong(text);
  if (ids.some((id) => id === undefined)) throw new Error(`Encoder.js gave an unknown token for record ${lines.length}`);
  lines.push(ids.join(' '));
}
fs.writeFileSync(idsOut, lines.join('\n') + '\n');
