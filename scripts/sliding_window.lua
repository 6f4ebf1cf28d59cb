-- Sliding window counter: the same function as src/algorithms/sliding_window.rs, line
-- for line, so memory and Redis decide alike (a differential test holds them to it).
--
-- KEYS[1]  the client's key under one rule: a hash of
--          w = index of the current window, p = previous window's count, c = current count
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
-- The comparison is multiplied through by the window length, in whole request-milliseconds
-- below 2^53 (the configuration guarantees it), so Lua's doubles are exact: the gateway
-- sends a cost of at most 2^50, a cost above the limit is refused before it is multiplied,
-- and a charge counts no more than twice the limit (the debt bound).
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

local stored = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local sw, sp, sc = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])

if ARGV[5] == 'charge' then
  -- Charge: counted in the current window whatever is left, past the limit if need be; its
  -- weight holds requests back until it has slid out.
  local now_ms = math.floor(now / 1000)
  if sw and sw * w > now_ms then
    now_ms = sw * w
  end
  local window = math.floor(now_ms / w)
  local previous, current = 0, 0
  if sw and sp and sc then
    if sw == window then
      previous, current = sp, sc
    elseif sw + 1 == window then
      previous, current = sc, 0
    end
  end
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', window),
    'p', string.format('%.0f', previous), 'c', string.format('%.0f', math.min(current + cost, 2 * limit)))
  redis.call('EXPIRE', KEYS[1], math.max(1, math.ceil(((window + 2) * w * 1000 - now) / 1000000)))
  return 1
end

if ARGV[5] ~= '' then
  -- Refund: take the cost back from the window it was counted in, if still remembered.
  local counted = math.floor(math.floor(tonumber(ARGV[5]) / 1000) / w)
  if sw and sw == counted then
    redis.call('HSET', KEYS[1], 'c', string.format('%.0f', math.max(0, sc - cost)))
  elseif sw and sw == counted + 1 then
    redis.call('HSET', KEYS[1], 'p', string.format('%.0f', math.max(0, sp - cost)))
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
local start = window * w
local elapsed = now_ms - start
local counted_at = math.max(now, now_ms * 1000)

local previous, current = 0, 0
if sw and sp and sc then
  if sw == window then
    previous, current = sp, sc
  elseif sw + 1 == window then
    previous, current = sc, 0
  end
end

local budget = limit * w
local previous_weight = previous * (w - elapsed)
local function after_ms(at_ms)
  return math.max(0, at_ms * 1000 - now)
end

if cost <= limit and previous_weight + (current + cost) * w <= budget then
  current = current + cost
  -- The current count leaves the sliding window when the next window ends, the previous one
  -- when this one does; with neither, the budget is whole already.
  local reset_after = 0
  if current > 0 then
    reset_after = after_ms(start + 2 * w)
  elseif previous > 0 then
    reset_after = after_ms(start + w)
  end
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', window),
    'p', string.format('%.0f', previous), 'c', string.format('%.0f', current))
  redis.call('EXPIRE', KEYS[1], math.max(1, math.ceil(reset_after / 1000000)))
  return {1, math.floor((budget - previous_weight - current * w) / w), 0, reset_after, counted_at}
end

-- Denied: nothing is counted, nothing written.
local reset_at = start + w
if current > 0 then
  reset_at = start + 2 * w
end
local allowed_at
if cost > limit then
  -- Never allowed, whatever it is; the honest bound to report is a full reset.
  allowed_at = reset_at
elseif current + cost <= limit then
  -- Only the previous window's weight is in the way: wait until it has shrunk enough.
  allowed_at = start + w - math.floor((limit - current - cost) * w / previous)
else
  -- Wait for the next window, where the current count becomes the weighted previous one.
  allowed_at = start + 2 * w - math.floor((limit - cost) * w / current)
end
return {0, 0, after_ms(allowed_at), after_ms(reset_at), counted_at}
