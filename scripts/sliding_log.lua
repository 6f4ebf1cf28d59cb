-- Sliding log, the exact rolling window: the same function as
-- src/algorithms/sliding_log.rs, line for line, so memory and Redis decide alike (a
-- differential test holds them to it).
--
-- KEYS[1]  the client's key under one rule: a list of the times (microseconds, decimal) of
--          its allowed requests, one entry per unit of cost, oldest first. A list, not a
--          sorted set: members of a set are unique, and equal times must each count.
-- ARGV[1]  limit, requests in any window-long stretch
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
-- now_us is the time the request was logged at (never before the newest entry).
--
-- Every number stays an integer below 2^53 (the configuration guarantees it, and the gateway
-- sends a cost of at most 2^50, clamped to the limit or twice it before it is used), so Lua's
-- doubles are exact; the list holds at most twice the limit (the debt bound).
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2]) * 1000
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

local charge = ARGV[5] == 'charge'
if ARGV[5] ~= '' and not charge then
  -- Refund: take back up to cost entries logged at that time, newest first (an empty list
  -- is deleted by Redis itself).
  redis.call('LREM', key, string.format('%.0f', -math.min(cost, 2 * limit)), string.format('%.0f', tonumber(ARGV[5])))
  return 1
end

-- A clock that stepped back must not log a request before an older one (the list stays
-- sorted) nor bring expired entries back to life.
local len = redis.call('LLEN', key)
local newest = tonumber(redis.call('LINDEX', key, -1))
local at = now
if newest and newest > at then
  at = newest
end
-- The budget is entirely back when the newest entry expires (now, if it has).
local reset = 0
if newest then
  reset = math.max(0, newest + window - now)
end

if charge then
  -- Charge: logged whatever is left, past the limit if need be. More than a window's limit
  -- of entries at one time holds requests back no longer than the limit does (they all
  -- expire together), so no more are logged: the list stays bounded.
  cost = math.min(cost, limit)
elseif cost > limit then
  -- Never allowed; the honest bound to report is a full reset.
  return {0, 0, reset, reset, at}
end
-- Oldest first: the request fits once the first len + cost - limit entries have expired, and
-- is held back by the last of them until it does. A denial writes nothing.
local excess = len + cost - limit
if excess > 0 and not charge then
  local blocker = tonumber(redis.call('LINDEX', key, excess - 1))
  if at < blocker + window then
    return {0, 0, blocker + window - now, reset, at}
  end
end

while true do
  local oldest = tonumber(redis.call('LINDEX', key, 0))
  if not oldest or oldest + window > at then
    break
  end
  redis.call('LPOP', key)
end
-- RPUSH takes many entries at once, but unpack is bounded by Lua's stack: push in chunks.
local entry = string.format('%.0f', at)
local chunk = {}
for i = 1, math.min(cost, 1000) do
  chunk[i] = entry
end
local pushed = 0
while pushed < cost do
  local n = math.min(#chunk, cost - pushed)
  redis.call('RPUSH', key, unpack(chunk, 1, n))
  pushed = pushed + n
end
-- Keep the key exactly as long as it matters: until the newest entry expires.
redis.call('EXPIRE', key, math.max(1, math.ceil((at + window - now) / 1000000)))
if charge then
  -- At most twice the limit in the list (the debt bound): the oldest entries go first.
  redis.call('LTRIM', key, -2 * limit, -1)
  return 1
end
-- A look of cost 0 logs nothing: the budget is back when the newest entry expires.
if cost == 0 then
  return {1, limit - redis.call('LLEN', key), 0, reset, at}
end
return {1, limit - redis.call('LLEN', key), 0, at + window - now, at}
