-- Take a share of one client's budget for one replica (a lease, src/stores/lease.rs), under
-- every limit of its rule at once, debited here at once: the replica then decides locally
-- from the share, and what it leaves unspent goes back as a refund would (the scripts of the
-- algorithms, ARGV[5] = the take's time). The arithmetic is docs/algorithms.md's "Leases".
--
-- KEYS[1..n]  the client's key under each limit, as the algorithms' scripts read them
-- KEYS[n+1]   the replicas taking shares of this client (a hash: replica -> last take, ms)
-- ARGV[1]     now in microseconds, or "" to read the Redis clock (only tests pin it)
-- ARGV[2]     "" for no deadline; else the time (µs, Redis clock) after which the gateway has
--             given up on this call: later, nothing changes and the reply is {-1, now_us}
-- ARGV[3]     the replica's id
-- ARGV[4]     the cost of the request that takes the share (spent from it at once)
-- ARGV[5]     the units the replica wants: about one lease period of its demand
-- ARGV[6]     the lease period, ms
-- ARGV[7..]   per limit, three values: the algorithm ("tb", "fw" or "sw") and its two numbers
--             (capacity and µs per token; limit and window ms)
--
-- The share s is the smallest over the limits of
--     min(want, cap, floor(avail / (2 * replicas)))
-- where avail is what the limit would still admit now, cap one second of refill for the
-- token bucket (no cap for the windows: their share ends with the window), and replicas
-- the replicas seen taking shares of this client within two lease periods, this one
-- included. A share below cost + 1 is no share: the request alone is decided (s = cost).
-- Returns {0, now} when some limit cannot admit the cost (the caller asks the algorithm's
-- own script, which tells when it could), else {s, now, then per limit: what the limit has
-- left after the share, µs until its budget is back, the time the share was counted at,
-- µs until the share must be spent (the window's end; -1 for the bucket)}.
--
-- Every number stays an integer below 2^53 (the configuration keeps capacity * interval and
-- limit * window below 2^50, the gateway sends a cost and a want of at most 2^50), so Lua's
-- doubles are exact.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local deadline = tonumber(ARGV[2])
if deadline and now > deadline then
  return {-1, now}
end
local cost = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local period_ms = tonumber(ARGV[6])
local n = #KEYS - 1
if not cost or not want or not period_ms or n < 1 then
  return redis.error_reply('lease_take: bad arguments')
end

-- The replicas taking shares: this one now, and those seen within two lease periods.
local now_ms = math.floor(now / 1000)
local registry = KEYS[n + 1]
local seen = redis.call('HGETALL', registry)
local replicas = 1
for i = 1, #seen, 2 do
  if seen[i] ~= ARGV[3] then
    local at = tonumber(seen[i + 1])
    if at and at + 2 * period_ms >= now_ms then
      replicas = replicas + 1
    else
      redis.call('HDEL', registry, seen[i])
    end
  end
end

local function number(value)
  local v = tonumber(value)
  -- NaN compares false both ways: a state no script wrote is a client never seen.
  if v and v ~= v then
    return nil
  end
  return v
end

-- Each limit read as its script reads it: what it admits now, and how to debit it.
local limits = {}
local share = want
for i = 1, n do
  local kind = ARGV[7 + (i - 1) * 3]
  local a = tonumber(ARGV[8 + (i - 1) * 3])
  local b = tonumber(ARGV[9 + (i - 1) * 3])
  local l = {kind = kind, a = a, b = b}
  if kind == 'tb' then
    local tau = a * b
    local tat = number(redis.call('GET', KEYS[i]))
    if not tat or tat < now then
      tat = now
    end
    if tat > now + 2 * tau then
      tat = now + 2 * tau
    end
    l.tat = tat
    l.avail = 0
    if tat - now <= tau then
      l.avail = math.floor((tau - (tat - now)) / b)
    end
    -- One second of refill: a share lost with its replica comes back within a second.
    l.cap = math.max(1, math.floor(1000000 / b))
    l.at = now
  elseif kind == 'fw' or kind == 'sw' then
    -- The windows' layout (scripts/fixed_window.lua, scripts/sliding_window.lua): the newest
    -- window counted at KEYS[i] .. ':w', each window's count at KEYS[i] .. ':' .. its index.
    local sw = number(redis.call('GET', KEYS[i] .. ':w'))
    local ms = now_ms
    if sw and sw * b > ms then
      ms = sw * b
    end
    local window = math.floor(ms / b)
    l.window = window
    l.start = window * b
    l.elapsed = ms - l.start
    l.at = math.max(now, ms * 1000)
    l.counter = KEYS[i] .. ':' .. string.format('%.0f', window)
    l.newest = sw
    l.stored = redis.call('GET', l.counter)
    if not number(l.stored) then
      l.stored = false
    end
    l.current = math.max(0, number(l.stored) or 0)
    if kind == 'fw' then
      l.avail = math.max(0, a - l.current)
      l.ttl = b + 1000
    else
      l.previous = math.max(0, number(redis.call('GET', KEYS[i] .. ':' .. string.format('%.0f', window - 1))) or 0)
      local room = a * b - l.previous * (b - l.elapsed) - l.current * b
      l.avail = math.max(0, math.floor(room / b))
      -- Counted here, a count is the previous one through the next window (as the sliding
      -- window's script sets it: more for a window ahead of the clock).
      l.ttl = 2 * b + 1000 + ms - now_ms
    end
    l.cap = want
  else
    return redis.error_reply('lease_take: no leases under ' .. tostring(kind))
  end
  if l.avail < cost then
    return {0, now}
  end
  share = math.min(share, l.cap, math.floor(l.avail / (2 * replicas)))
  limits[i] = l
end
if share < cost + 1 then
  share = cost
end

redis.call('HSET', registry, ARGV[3], string.format('%.0f', now_ms))
redis.call('PEXPIRE', registry, 2 * period_ms)

local reply = {share, now}
for i = 1, n do
  local l = limits[i]
  local a, b = l.a, l.b
  local reset_after, until_end
  if l.kind == 'tb' then
    local new_tat = l.tat + share * b
    redis.call('SET', KEYS[i], string.format('%.0f', new_tat), 'EX', math.max(1, math.ceil((new_tat - now) / 1000000)))
    reset_after = new_tat - now
    until_end = -1
  else
    local count = l.current + share
    until_end = (l.window + 1) * b * 1000 - now
    -- As the windows' scripts count: a delta keeps the key's expiry, a new key gets its own
    -- (the window and a second; two windows and a second for the sliding window).
    if l.stored then
      redis.call('INCRBY', l.counter, string.format('%.0f', count - tonumber(l.stored)))
    else
      redis.call('SET', l.counter, string.format('%.0f', count), 'PX', l.ttl)
    end
    if not l.newest or l.window > l.newest then
      redis.call('SET', KEYS[i] .. ':w', string.format('%.0f', l.window), 'PX', l.ttl)
    end
    if l.kind == 'fw' then
      reset_after = until_end
    else
      reset_after = math.max(0, (l.start + 2 * b) * 1000 - now)
    end
  end
  reply[#reply + 1] = l.avail - share
  reply[#reply + 1] = math.max(0, reset_after)
  reply[#reply + 1] = l.at
  reply[#reply + 1] = math.max(-1, until_end)
end
return reply
