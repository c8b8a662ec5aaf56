#!/usr/bin/env bash
# Builds the seed corpora: fuzz/corpus/{descriptor,yaml} from the kit examples and
# fuzz/corpus/h1 from representative HTTP/1.1 requests (see the h1 step at the end).
# The corpus is not committed (/fuzz/corpus is gitignored); run this before fuzzing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
shared="${SHARED_DIR:-$(dirname "$repo")/shared}"
out="$here/corpus/descriptor"
mkdir -p "$out" "$here/corpus/yaml"
n=0
shopt -s nullglob
for f in "$shared"/corpus/sandbox-kit-spec/examples/*/*.yaml "$shared"/corpus/sandbox-kit-spec/examples/*/*.yml; do
  cp "$f" "$out/spec-$(basename "$(dirname "$f")")-$(basename "$f")"; n=$((n+1))
done
for f in "$repo"/examples/kits/*/kit.yaml; do
  cp "$f" "$out/kit-$(basename "$(dirname "$f")").yaml"; n=$((n+1))
done
# The raw reader starts from the same texts.
cp "$out"/* "$here/corpus/yaml/" 2>/dev/null || true
echo "seeded $n files into $out (and corpus/yaml)"

# h1: representative requests for the gateway's HTTP/1.1 codec (fuzz_targets/h1.rs),
# including smuggling attempts from crates/gateway/tests/smuggling.rs. `printf %b` expands
# the \r \n \t \xNN escapes; `%` in the text is kept as is.
h1="$here/corpus/h1"
mkdir -p "$h1"
h1_seed() { printf '%b' "$2" > "$h1/$1"; }
h1_seed get-origin          'GET /index.html?q=a%20b HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n'
h1_seed get-absolute        'GET http://example.com:8080/a/b?c=d HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, Upgrade\r\n\r\n'
h1_seed get-absolute-query  'GET HTTP://Allowed.com:8080?q=1 HTTP/1.1\r\nHost: evil.com\r\n\r\n'
h1_seed connect             'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic dXNlcjpwYXNz\r\n\r\n'
h1_seed connect-ipv6        'CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n'
h1_seed options-asterisk    'OPTIONS * HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n'
h1_seed http10-keepalive    'GET / HTTP/1.0\r\nConnection: keep-alive\r\nX-Obs: caf\xc3\xa9\r\n\r\n'
h1_seed post-length         'POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello'
h1_seed post-chunked-trailers 'POST /api HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5;name="v"\r\nhello\r\n1\r\n!\r\nA\r\n0123456789\r\n0\r\nX-Sum: 1\r\nX-Other:\tv\r\n\r\n'
h1_seed pipelined           'GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'
h1_seed pipelined-chunked   'POST /one HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n'
h1_seed smuggle-cl-te       'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n'
h1_seed smuggle-te-obfuscated 'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\nTransfer-Encoding: xchunked\r\nTRANSFER-ENCODING:\tCHUNKED \t\r\n\r\n0\r\n\r\n'
h1_seed smuggle-bare-lf     'GET / HTTP/1.1\nHost: foo.bar\n\nPOST / HTTP/1.1\r\nHost: a\r\nX: y\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n'
h1_seed smuggle-chunk-size  'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0x5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n'
h1_seed smuggle-userinfo    'GET http://allowed.com@evil.com/ HTTP/1.1\r\nHost: allowed.com\r\nHost: %65vil.com\r\nX-A: b\r\n c\r\n\r\n'
h1_seed response-chunked    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n'
h1_seed response-length     'HTTP/1.0 304 Not Modified\r\nContent-Length: 10\r\nContent-Length: 10\r\n\r\n'
echo "seeded $(ls "$h1" | wc -l) files into $h1"
