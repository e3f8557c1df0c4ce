-- wrk script for tests/bench/run.sh: rotates over the requests listed in $BENCH_REQS.
-- Each line: METHOD PATH [RANGE] (RANGE like bytes=0-65535 becomes a Range header).
-- Prints one line "WRK requests= seconds= rps= p50_ms= p99_ms= errors= non2xx3xx=" at the end.
local reqs = {}
local n = 0
local i = 0
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  local file = assert(io.open(os.getenv("BENCH_REQS"), "r"))
  for line in file:lines() do
    local method, path, range = line:match("^(%S+)%s+(%S+)%s*(%S*)$")
    if method then
      local headers = {}
      for k, v in pairs(wrk.headers) do headers[k] = v end -- wrk -H ...
      if range ~= "" then headers["Range"] = range end
      n = n + 1
      reqs[n] = wrk.format(method, path, headers)
    end
  end
  file:close()
  assert(n > 0, "no requests in " .. os.getenv("BENCH_REQS"))
  -- Threads start at different places so that they do not ask for the same blob in step.
  i = ((id or 1) * 7919) % n
end

function request()
  i = i % n + 1
  return reqs[i]
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    "WRK requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f errors=%d non2xx3xx=%d\n",
    summary.requests, secs, summary.requests / secs, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, e.connect + e.read + e.write + e.timeout, e.status))
end
