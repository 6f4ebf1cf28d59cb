-- Fixed window counter: the same function as src/algorithms/fixed_window.rs, line for
-- line, so memory and Redis decide alike (a differential test holds them to it).
--
-- KEYS[1]  the client's key under one rule: a hash of
--          w = index of the window counted in (windows are aligned to the Unix epoch),
--          c = requests counted in it
-- ARGV[1]  limit, requests per window
-- ARGV[2]  window length in milliseconds
-- ARGV[3]  cost of this request
-- ARGV[4]  now in microseconds, or "" to read the Redis clock (only tests pin it)
-- ARGV[5]  "" to decide; the decision's time in microseconds to refund its cost; "charge"
--          to spend the cost whatever is left, into debt if need be (a cost the backend
--          reported after the response)
-- ARGV[6]  "" for no deadline; else the time (microseconds, on the Redis clock) after which
--          the gateway has given up on this call: later, the script changes nothing and
--          returns {-1, now_us} ("expired")
-- A decision returns {allowed 1|0, remaining, retry_after_us, reset_after_us, now_us}, where
-- now_us is the time the request was counted at (never before the stored window).
--
-- Every number stays an integer below 2^53 (the configuration guarantees it, the gateway
-- sends a cost of at most 2^50, and a charge counts no more than twice the limit, the debt
-- bound), so Lua's doubles are exact.
local limit = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A call that waited past its deadline (a Redis frozen or busy) was answered by the fail
-- mode already: counting it now would charge the client for a request it was refused.
local deadline = tonumber(ARGV[6])
if deadline and now > deadline then
  return {-1, now}
end

local stored = redis.call('HMGET', KEYS[1], 'w', 'c')
local sw, sc = tonumber(stored[1]), tonumber(stored[2])

if ARGV[5] == 'charge' then
  -- Charge: counted in the current window whatever is left, past the limit if need be; the
  -- window's end forgives the debt, as it starts every count afresh.
  local now_ms = math.floor(now / 1000)
  if sw and sw * w > now_ms then
    now_ms = sw * w
  end
  local window = math.floor(now_ms / w)
  local count = cost
  if sw == window and sc then
    count = sc + cost
  end
  count = math.min(count, 2 * limit)
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', window), 'c', string.format('%.0f', count))
  redis.call('EXPIRE', KEYS[1], math.max(1, math.ceil(((window + 1) * w * 1000 - now) / 1000000)))
  return 1
end

if ARGV[5] ~= '' then
  -- Refund: only the window the request was counted in can give it back.
  local counted = math.floor(math.floor(tonumber(ARGV[5]) / 1000) / w)
  if sw == counted and sc then
    redis.call('HSET', KEYS[1], 'c', string.format('%.0f', math.max(0, sc - cost)))
  end
  return 1
end

-- A clock that stepped back must not erase newer counts: never place now before the stored
-- window.
local now_ms = math.floor(now / 1000)
if sw and sw * w > now_ms then
  now_ms = sw * w
end
local window = math.floor(now_ms / w)
local count = 0
if sw == window and sc then
  count = sc
end
local until_end = (window + 1) * w * 1000 - now
local counted_at = math.max(now, now_ms * 1000)

if count + cost <= limit then
  count = count + cost
  -- Relative, not PEXPIREAT: an absolute expiry is read on the server's clock, not on now.
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', window), 'c', string.format('%.0f', count))
  redis.call('EXPIRE', KEYS[1], math.max(1, math.ceil(until_end / 1000000)))
  -- Nothing counted (a look of cost 0 at a whole budget): nothing to wait for.
  local reset_after = until_end
  if count == 0 then
    reset_after = 0
  end
  return {1, limit - count, 0, reset_after, counted_at}
end

-- Denied: nothing is counted, nothing written. The request fits when the window ends.
return {0, 0, until_end, until_end, counted_at}
