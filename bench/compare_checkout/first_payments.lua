-- wrk script for bench/compare_checkout.sh: every request is a FIRST payment.
--   wrk -s first_payments.lua <url> -- <key-prefix> [accounts]
-- The Idempotency-Key is <key-prefix>-<thread>-<counter>, unique per request; the prefix names
-- the implementation and round, because both checkouts charge the same provider stub, whose
-- charges are unique per (merchant, key). Requests rotate over a handful of bearer accounts.
-- Only 201s are successes: `response` counts every status, `done` prints the counts.

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  prefix = args[1] or "k"
  accounts = tonumber(args[2] or "5")
  counter = 0
  statuses = {}
  body = '{"amount":4200,"currency":"eur","source":"tok_visa"}'
end

function request()
  counter = counter + 1
  local headers = {
    ["Authorization"] = "Bearer acct_" .. (counter % accounts),
    ["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter,
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/v1/payments", headers, body)
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

-- Thread states are separate Lua states: read each thread's table as a string.
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for k, v in pairs(s) do total[k] = (total[k] or 0) + v end
  end
  local ok = total[201] or 0
  io.write(string.format("RESULT ok201=%d seconds=%.3f p50_ms=%.2f p99_ms=%.2f socket_errors=%d\n",
    ok, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
  for k, v in pairs(total) do
    if k ~= 201 then io.write(string.format("NON201 status=%d count=%d\n", k, v)) end
  end
end
