-- The token bucket's decision on Redis's clock, lean: the hot path of
-- scripts/token_bucket.lua (which pinned clocks, refunds, charges, peeks and batches still
-- run) with the fewest arguments, numbers and calls. It decides and writes exactly as the
-- full script, on the same key; the gateway derives the decision's numbers from the reply
-- (TokenBucket::decide, src/algorithms/token_bucket.rs), and a property test on a real
-- redis-server holds the two to each other.
--
-- KEYS[1]  the client's key under one rule: the TAT in µs, as the full script keeps it
-- ARGV[1]  tau, the capacity x the interval (µs)
-- ARGV[2]  the request's increment: its cost (at most the capacity + 1) x the interval (µs)
-- ARGV[3]  the deadline (µs on the Redis clock) after which the call changes nothing and
--          returns {-1, now_us} ("expired"), or "" for none
-- Returns {now_us, tat}: the Redis time and the TAT the decision started from (never before
-- now nor past the debt bound); the request was allowed, and the TAT moved on by the
-- increment, when that leaves it within tau of now.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local deadline = tonumber(ARGV[3])
if deadline and now > deadline then
  return {-1, now}
end
local tau = tonumber(ARGV[1])
-- Bounded as the full script bounds a cost: no more than a capacity + 1's worth matters.
local increment = math.min(tonumber(ARGV[2]), 2 * tau)
local tat = tonumber(redis.call('GET', KEYS[1]))
-- Expiry is absolute, on the clock just read (no rewrite for propagation, as EX has): the
-- first millisecond past the TAT, when the bucket is full again.
if not (tat and tat >= now) then
  -- A client never seen, a full bucket, or not a number (NaN compares false).
  tat = now
elseif tat > now + 2 * tau then
  -- Past the debt bound: tidied to it (and so it ages), as the full script does.
  tat = now + 2 * tau
  redis.call('SET', KEYS[1], tat, 'PXAT', math.floor(tat / 1000) + 1)
end
local new_tat = tat + increment
if new_tat - now <= tau then
  redis.call('SET', KEYS[1], new_tat, 'PXAT', math.floor(new_tat / 1000) + 1)
end
return {now, tat}
