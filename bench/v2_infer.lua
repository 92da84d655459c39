-- wrk script for the benchmarks: POST one KServe V2 inference body per request.
--
--   wrk -t1 -c32 -d10s -s bench/v2_infer.lua http://127.0.0.1:PORT/v2/models/M/infer -- BODIES
--
-- BODIES is a file with one complete JSON request body per line (bench/kit.py write_bodies writes it);
-- requests rotate through the lines. A BODIES file named *.bin holds bodies with binary tensor data
-- (the V2 binary extension; bench/images.py write_binary_bodies writes it): each is a line
-- "<json header length> <body length>", the body's bytes and a newline; each is sent with its
-- Inference-Header-Content-Length. done() prints two machine-readable lines:
--   BENCH_RESULT requests=.. duration_us=.. p50_us=.. p99_us=.. mean_us=.. max_us=..
--   errors_connect=.. errors_read=.. errors_write=.. errors_status=.. errors_timeout=..
--   BENCH_HIST <latency_us> ... (the 0.05th, 0.15th, ... 99.95th percentiles, microseconds):
--   wrk's Lua API gives percentiles, not samples; these let runs be merged into percentiles
--   (a p99 over ten runs is not the mean of ten p99s), at 0.1% resolution

local requests = {}
local counter = 0

function init(args)
  local path = args[1]
  if path == nil then
    error("usage: wrk ... -s v2_infer.lua URL -- BODIES_FILE")
  end
  if path:match("%.bin$") then
    local file = assert(io.open(path, "rb"))
    while true do
      local line = file:read("*l")
      if line == nil or #line == 0 then
        break
      end
      local header, size = line:match("^(%d+) (%d+)$")
      if header == nil then
        error("bad record line in " .. path .. ": " .. line)
      end
      local body = file:read(tonumber(size))
      file:read(1) -- the newline after the body
      requests[#requests + 1] = wrk.format("POST", nil, {
        ["Content-Type"] = "application/octet-stream",
        ["Inference-Header-Content-Length"] = header}, body)
    end
    file:close()
  else
    local headers = {["Content-Type"] = "application/json"}
    for line in io.lines(path) do
      if #line > 0 then
        requests[#requests + 1] = wrk.format("POST", nil, headers, line)
      end
    end
  end
  if #requests == 0 then
    error("no request bodies in " .. path)
  end
end

function request()
  counter = counter + 1
  return requests[(counter - 1) % #requests + 1]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d mean_us=%.1f max_us=%d "
      .. "errors_connect=%d errors_read=%d errors_write=%d errors_status=%d "
      .. "errors_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.mean, latency.max, e.connect, e.read, e.write, e.status, e.timeout))
  -- 1000 evenly spaced quantiles: each stands for a thousandth of this run's requests
  local parts = {}
  if summary.requests > 0 then
    for i = 1, 1000 do
      parts[#parts + 1] = string.format("%d", latency:percentile((i - 0.5) / 10))
    end
  end
  io.write("BENCH_HIST " .. table.concat(parts, " ") .. "\n")
end
