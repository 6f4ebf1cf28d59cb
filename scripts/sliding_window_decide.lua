-- The sliding window's decision on Redis's clock, lean: the hot path of
-- scripts/sliding_window.lua (which pinned clocks, refunds, charges, peeks and batches still
-- run) with the fewest arguments, numbers and calls. It decides and writes exactly as the
-- full script, on the same hash; the gateway derives the decision's numbers from the reply
-- (SlidingWindow::decide, src/algorithms/sliding_window.rs), and a property test on a real
-- redis-server holds the two to each other.
--
-- KEYS[1]  the client's key under one rule: a hash of w (window index), p and c (counts)
-- ARGV[1]  window length in milliseconds
-- ARGV[2]  limit, requests per window
-- ARGV[3]  cost of this request (the gateway sends at most the limit + 1)
-- ARGV[4]  the deadline (µs on the Redis clock) after which the call changes nothing and
--          returns {-1, now_us} ("expired"), or "" for none
-- Returns {now_us, w, p, c}, the Redis time and the state the decision read ({now_us} for
-- none); the request was allowed, and counted, when it fits the sliding window.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local deadline = tonumber(ARGV[4])
if deadline and now > deadline then
  return {-1, now}
end
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local cost = math.min(tonumber(ARGV[3]), limit + 1)
local stored = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local sw, sp, sc = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
-- Counts are only read together (as the full script reads them).
if not (sp and sc) then
  sp, sc = 0, 0
end
local now_ms = math.floor(now / 1000)
if sw and sw * w > now_ms then
  now_ms = sw * w
end
local window = math.floor(now_ms / w)
local start = window * w
local previous, current = 0, 0
if sw == window then
  previous, current = sp, sc
elseif sw and sw + 1 == window then
  previous = sc
end
if cost <= limit and previous * (w - now_ms + start) + (current + cost) * w <= limit * w then
  redis.call('HSET', KEYS[1], 'w', window, 'p', previous, 'c', current + cost)
  -- Absolute, on the clock just read (no rewrite for propagation, as EXPIRE has): nothing
  -- it counts weighs two windows on.
  redis.call('PEXPIREAT', KEYS[1], start + 2 * w)
end
if sw then
  return {now, sw, sp, sc}
end
return {now}
