-- wrk script for bench/gateway.sh.
-- With TARGET_URL set, every request is absolute-form (`GET http://host:port/path`), as a
-- client sends it to a forward proxy, with `Host: TARGET_HOST`; without it, wrk's own
-- origin-form request (direct to nginx). Either way, `done` prints one machine-readable
-- line that gateway.sh parses:
--   RESULT rps=<req/s> bps=<bytes/s> p50_us=<..> p99_us=<..> requests=<n> errors=<n>
local url = os.getenv("TARGET_URL")
local host = os.getenv("TARGET_HOST")
if url and url ~= "" then
  wrk.path = url
  wrk.headers["Host"] = host
end

function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.status + e.timeout
  io.write(string.format(
    "RESULT rps=%.1f bps=%.1f p50_us=%d p99_us=%d requests=%d errors=%d" ..
    " connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests / secs, summary.bytes / secs,
    latency:percentile(50), latency:percentile(99),
    summary.requests, errors, e.connect, e.read, e.write, e.status, e.timeout))
end
