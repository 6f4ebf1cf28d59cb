-- Fixed window counter: the same function as src/algorithms/fixed_window.rs, line for
-- line, so memory and Redis decide alike (a differential test holds them to it).
--
-- The layout is the one the gateway decides on without a script (`INCRBY` + `PEXPIRE NX`,
-- src/stores/redis.rs): a key per window, KEYS[1] .. ':' .. the window's index (windows are
-- aligned to the Unix epoch), holding the window's count as a plain integer and expiring
-- W + 1000 ms after its first count (past the window's end, whatever the clock estimate's
-- error up to a second). Beside them, KEYS[1] .. ':w' holds the newest window this script
-- counted in (what the Rust state calls its window), so a clock that steps back counts in
-- it rather than in an older window, as the memory store does. KEYS[1] itself is not used
-- (it held the hash {w, c} before; a rolling upgrade leaves it to expire).
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

local newest = KEYS[1] .. ':w'
local ttl = w + 1000
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
-- expiry, a new key (or one that held no whole number, as the lean part reads it: written
-- afresh) gets its own.
local function store(window, stored, count)
  local key = counter(window)
  local held = tonumber(stored)
  if held and held >= 0 and held < 9007199254740992 and held == math.floor(held) then
    redis.call('INCRBY', key, string.format('%.0f', count - held))
  else
    redis.call('SET', key, string.format('%.0f', count), 'PX', ttl)
  end
end
-- The window now falls in, never before the newest one counted (a clock that stepped back
-- must not count in an older window), and that window's count as stored.
local function place(now_ms, sw)
  if sw and sw * w > now_ms then
    now_ms = sw * w
  end
  local window = math.floor(now_ms / w)
  return now_ms, window
end
local function counted(window, sw)
  if not sw or window > sw then
    redis.call('SET', newest, string.format('%.0f', window), 'PX', ttl)
  end
end

if ARGV[5] ~= '' and ARGV[5] ~= 'charge' then
  -- Refund: only the window the request was counted in can give it back, while it is the
  -- newest (a decision without a script counts without moving ':w': never ahead of it).
  local at = tonumber(ARGV[5])
  if not at then
    return 1
  end
  local window = math.floor(math.floor(at / 1000) / w)
  local sw = tonumber(redis.call('GET', newest))
  if not sw or sw <= window then
    local stored = redis.call('GET', counter(window))
    if stored then
      store(window, stored, math.max(0, count_of(stored) - cost))
    end
  end
  return 1
end

local sw = tonumber(redis.call('GET', newest))
local now_ms, window = place(math.floor(now / 1000), sw)
local stored = redis.call('GET', counter(window))
local count = count_of(stored)

if ARGV[5] == 'charge' then
  -- Charge: counted in the current window whatever is left, past the limit if need be; the
  -- window's end forgives the debt, as it starts every count afresh.
  store(window, stored, math.min(count + cost, 2 * limit))
  counted(window, sw)
  return 1
end

local until_end = (window + 1) * w * 1000 - now
local counted_at = math.max(now, now_ms * 1000)

if count + cost <= limit then
  -- A look of cost 0 writes nothing: nothing counted, nothing to wait for.
  if cost == 0 then
    local reset_after = until_end
    if count == 0 then
      reset_after = 0
    end
    return {1, limit - count, 0, reset_after, counted_at}
  end
  count = count + cost
  store(window, stored, count)
  counted(window, sw)
  return {1, limit - count, 0, until_end, counted_at}
end

-- Denied: nothing is counted, nothing written. The request fits when the window ends.
return {0, 0, until_end, until_end, counted_at}
