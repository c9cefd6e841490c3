-- wrk script for benchmarks/serving.py: one fixed POST, a request cap, and a summary line.
-- Arguments after `--`: the body's file, the request cap, then header names and values.
local cap, count = 0, 0

function init(args)
  local file = assert(io.open(args[1], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  file:close()
  cap = tonumber(args[2])
  for i = 3, #args - 1, 2 do wrk.headers[args[i]] = args[i + 1] end
end

function response(status, headers, body)
  count = count + 1
  if count >= cap then wrk.thread:stop() end
end

-- Latency quantiles in microseconds, every 0.5% and every 0.1% above 99%, so that the rounds
-- of one target can be pooled into one distribution.
function done(summary, latency, requests)
  local e = summary.errors
  local points = {}
  for tenth = 0, 1000, 5 do
    if tenth >= 990 and tenth < 1000 then
      for t = tenth, tenth + 4 do points[#points + 1] = string.format("%d", latency:percentile(t / 10)) end
    else
      points[#points + 1] = string.format("%d", latency:percentile(tenth / 10))
    end
  end
  io.write(string.format(
    'KILN_WRK {"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"quantiles_us":[%s]}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    e.status, table.concat(points, ",")))
end
