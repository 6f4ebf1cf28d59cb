-- Sliding window counter: the same function as src/algorithms/sliding_window.rs, line
-- for line, so memory and Redis decide alike (a differential test holds them to it).
--
-- The fixed window's layout (scripts/fixed_window.lua), the one the gateway decides on
-- without a script (`INCRBY` + `PEXPIRE NX` + `GET` of the window before, src/stores/redis.rs):
-- a key per window, KEYS[1] .. ':' .. the window's index (windows aligned to the Unix epoch),
-- holding the window's count as a plain integer and expiring 2W + 1000 ms after its first
-- count (past the end of the window after it, where it is the previous count, whatever the
-- clock estimate's error up to a second; for a window ahead of the clock, as far ahead more). Beside them, KEYS[1] .. ':w' holds the newest window
-- this script counted in (the Rust state's `window`), so a clock that steps back counts in it
-- rather than in an older window, as the memory store does. KEYS[1] itself is not used (it
-- held the hash {w, p, c} before; a rolling upgrade leaves it to expire).
--
-- KEYS[1]  the client's key under one rule
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
-- now_us is the time the request was counted at (never before the newest window counted).
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

local newest = KEYS[1] .. ':w'
-- A new count's expiry, relative: two windows and a second (below, more for a window ahead of
-- the clock, one a clock that stepped back counts in).
local ttl = 2 * w + 1000
local function counter(window)
  return KEYS[1] .. ':' .. string.format('%.0f', window)
end
-- A count no script wrote (a give-back that met a reset: below zero) is read as nothing.
local function count_of(value)
  local v = tonumber(value)
  if not v or v ~= v or v < 0 then
    return 0
  end
  return v
end
-- Set window's count to count, from what it held (stored, or false): a delta keeps the key's
-- expiry, a new key gets its own.
local function store(window, stored, count)
  local key = counter(window)
  if stored then
    redis.call('INCRBY', key, string.format('%.0f', count - tonumber(stored)))
  else
    redis.call('SET', key, string.format('%.0f', count), 'PX', ttl)
  end
end
local function counted(window, sw)
  if not sw or window > sw then
    redis.call('SET', newest, string.format('%.0f', window), 'PX', ttl)
  end
end

if ARGV[5] ~= '' and ARGV[5] ~= 'charge' then
  -- Refund: take the cost back from the window it was counted in. While that window is the
  -- current or the previous one, that is what the memory store takes it from; older, its
  -- count is read by no decision any more.
  local at = tonumber(ARGV[5])
  if not at then
    return 1
  end
  local window = math.floor(math.floor(at / 1000) / w)
  local stored = redis.call('GET', counter(window))
  if tonumber(stored) then
    store(window, stored, math.max(0, count_of(stored) - cost))
  end
  return 1
end

-- A clock that stepped back must not erase newer counts: never place now before the newest
-- window counted.
local sw = tonumber(redis.call('GET', newest))
local now_ms = math.floor(now / 1000)
if sw and sw * w > now_ms then
  now_ms = sw * w
end
local window = math.floor(now_ms / w)
ttl = ttl + now_ms - math.floor(now / 1000)
local stored = redis.call('GET', counter(window))
local previous, current = count_of(redis.call('GET', counter(window - 1))), count_of(stored)
if not tonumber(stored) then
  stored = false
end

if ARGV[5] == 'charge' then
  -- Charge: counted in the current window whatever is left, past the limit if need be; its
  -- weight holds requests back until it has slid out.
  store(window, stored, math.min(current + cost, 2 * limit))
  counted(window, sw)
  return 1
end

local start = window * w
local elapsed = now_ms - start
local counted_at = math.max(now, now_ms * 1000)
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
  -- A look of cost 0 writes nothing.
  if cost > 0 then
    store(window, stored, current)
    counted(window, sw)
  end
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
