-- Concurrency, places held by requests in flight: the same function as
-- src/algorithms/concurrent.rs, line for line, so memory and Redis decide alike (a
-- differential test holds them to it).
--
-- KEYS[1]  the client's key under one rule: a sorted set of its leases, each member a lease's
--          name (the microsecond it was taken at, decimal; "ID:1".."ID:cost-1" for the further
--          places of a request of higher cost) scored by when it expires (microseconds)
-- ARGV[1]  places, requests in flight at once
-- ARGV[2]  lease length in milliseconds
-- ARGV[3]  cost of this request (the places it takes)
-- ARGV[4]  now in microseconds, or "" to read the Redis clock (only tests pin it)
-- ARGV[5]  "" to decide; a lease's name to give it back (ARGV[3] the cost it was taken with);
--          "r" and a lease's name to renew it, as if taken now (ARGV[3] the same); "charge"
--          does nothing (a reported cost spends no places)
-- ARGV[6]  "" for no deadline; else the time (microseconds, on the Redis clock) after which
--          the gateway has given up on this call: later, the script changes nothing and
--          returns {-1, now_us} ("expired")
-- A decision returns {allowed 1|0, remaining, retry_after_us, reset_after_us, now_us}, where
-- now_us is the name of the lease taken (never before now).
--
-- Every number stays an integer below 2^53 (the configuration guarantees it, and the gateway
-- sends a cost of at most 2^50), so Lua's doubles are exact; a cost above the places is
-- refused before any loop, and a give-back or a renewal loops over no more than the places.
local key = KEYS[1]
local places = tonumber(ARGV[1])
local lease = tonumber(ARGV[2]) * 1000
local cost = tonumber(ARGV[3])
-- A lease holds no more than the places: the loops below are bounded by them.
local held_by_lease = math.min(cost, places)
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local deadline = tonumber(ARGV[6])
if deadline and now > deadline then
  return {-1, now}
end

-- The batch script hands a refund's time over as a number (whose tostring would round it),
-- the gateway as text.
local refund = ARGV[5]
if type(refund) == 'number' then
  refund = string.format('%.0f', refund)
end
if refund == 'charge' then
  -- Charge: a cost reported after the response spends no places (a place is a request in
  -- flight, given back when it ends); nothing to do.
  return 1
end
if refund:sub(1, 1) == 'r' then
  -- Renew: a lease not expired nor given back lasts its length from now.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
  local id = string.format('%.0f', tonumber(refund:sub(2)))
  local expires = string.format('%.0f', now + lease)
  if redis.call('ZADD', key, 'XX', 'CH', expires, id) == 1 then
    for i = 1, held_by_lease - 1 do
      redis.call('ZADD', key, 'XX', expires, id .. ':' .. i)
    end
    redis.call('EXPIRE', key, math.max(1, math.ceil(lease / 1000000)))
  end
  return 1
end

if refund ~= '' then
  -- Give back: the lease of that name and its further places (the cost it was taken with).
  -- One given back already, or expired, is gone: a second refund changes nothing.
  local id = string.format('%.0f', tonumber(refund))
  redis.call('ZREM', key, id)
  for i = 1, held_by_lease - 1 do
    redis.call('ZREM', key, id .. ':' .. i)
  end
  return 1
end

-- Expired leases hold nothing: tidying them changes no decision.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
local held = redis.call('ZCARD', key)
-- Every place is back when the last lease expires (if none is given back before).
local reset = 0
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  reset = tonumber(last[2]) - now
end
local free = math.max(0, places - held)
if cost > free then
  return {0, 0, 1000000, reset, now}
end
if cost == 0 then
  -- A look (the admin's inspection): no lease.
  return {1, free, 0, reset, now}
end
local id = now
while redis.call('ZSCORE', key, string.format('%.0f', id)) do
  id = id + 1
end
local name = string.format('%.0f', id)
local expires = string.format('%.0f', now + lease)
redis.call('ZADD', key, expires, name)
for i = 1, cost - 1 do
  redis.call('ZADD', key, expires, name .. ':' .. i)
end
redis.call('EXPIRE', key, math.max(1, math.ceil(math.max(reset, lease) / 1000000)))
return {1, free - cost, 0, math.max(reset, lease), id}
