-- Token bucket as GCRA: the same function as src/algorithms/token_bucket.rs, line for
-- line, so memory and Redis decide alike (a differential test holds them to it).
--
-- KEYS[1]  the client's key under one rule; holds the theoretical arrival time (TAT), in
--          microseconds, at which the bucket is full again
-- ARGV[1]  capacity, in tokens
-- ARGV[2]  microseconds to refill one token
-- ARGV[3]  cost of this request, in tokens
-- ARGV[4]  now in microseconds, or "" to read the Redis clock (only tests pin it)
-- ARGV[5]  "" to decide; the decision's time in microseconds to refund its cost; "charge"
--          to spend the cost whatever is left, into debt if need be (a cost the backend
--          reported after the response)
-- ARGV[6]  "" for no deadline; else the time (microseconds, on the Redis clock) after which
--          the gateway has given up on this call: later, the script changes nothing and
--          returns {-1, now_us} ("expired")
-- A decision returns {allowed 1|0, remaining, retry_after_us, reset_after_us, now_us}.
--
-- Every number stays an integer below 2^53, so Lua's doubles are exact and the reply's
-- integer conversion loses nothing: the configuration keeps capacity * interval below 2^50,
-- the gateway sends a cost of at most 2^50, a cost above the capacity is decided as the
-- capacity + 1 before it is multiplied, and the TAT is never more than two capacities ahead of now (the debt bound: a
-- charge leaves no more, and a stored TAT beyond it, which no charge of this script writes,
-- counts as it and is written back so).
local capacity = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
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
local tau = capacity * interval
local bound = now + 2 * tau
local stored = tonumber(redis.call('GET', KEYS[1]))
-- Not a number (nor NaN, which compares false both ways): a client never seen.
if stored and stored ~= stored then
  stored = nil
end

if ARGV[5] == 'charge' then
  -- Charge: the TAT moves on by the cost from now or where it is, past the capacity if need
  -- be, but never past the debt bound: requests are refused until the debt has refilled.
  local tat = stored
  if not tat or tat < now then
    tat = now
  end
  tat = math.min(tat + math.min(cost, 2 * capacity) * interval, bound)
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'EX', math.max(1, math.ceil((tat - now) / 1000000)))
  return 1
end

if ARGV[5] ~= '' then
  -- Refund: moving the TAT back by the cost undoes the request whenever it was made (no more
  -- than the debt bound's worth: the TAT is never further ahead).
  if stored then
    local tat = math.max(0, stored - math.min(cost, 2 * capacity) * interval)
    redis.call('SET', KEYS[1], string.format('%.0f', tat), 'EX', math.max(1, math.ceil((tat - now) / 1000000)))
  end
  return 1
end

local tat = stored
if not tat or tat < now then
  tat = now
end
if tat > bound then
  -- Past the debt bound: tidied to it (and so it ages), as the memory store does.
  tat = bound
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'EX', math.max(1, math.ceil((tat - now) / 1000000)))
end
if cost > capacity then
  -- Never allowed, whatever it is: decided as the capacity + 1 (so nothing larger is ever
  -- multiplied), whose retry time is when a bucket one token larger would hold it.
  cost = capacity + 1
end
local new_tat = tat + cost * interval
if new_tat - now > tau then
  -- Denied: nothing is consumed, nothing written.
  return {0, 0, new_tat - tau - now, tat - now, now}
end

-- Keep the key exactly as long as it matters: until the bucket is full again.
local ttl = math.max(1, math.ceil((new_tat - now) / 1000000))
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'EX', ttl)
return {1, math.floor((tau - (new_tat - now)) / interval), 0, new_tat - now, now}
