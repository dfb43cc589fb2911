-- room_take.lua: buyers take their places in a product's waiting room
-- (stock/room.h), several in one call (the places asked of an instance
-- while the last call ran): one place per user; the place a user has is
-- given back as it is, unless its turn is over (then a new one at the
-- back). In the order given: the users' positions follow it.
--
-- The counter moves here too, as room_tick.lua moves it (by the rate,
-- times the time since it last moved, never past the last place issued
-- nor the cap by the units the last beat left in the hash): a room whose
-- rate keeps up with its arrivals gives a new place its turn in the call
-- that takes it, so the buyer orders in the same request
-- (service/api/tickets.c) rather than hearing its turn a beat later. The
-- time counted is at most BANK_MS: a room idle for long banks no burst.
--
-- A sale with an opening time (ARGV[3] > 0): before it, no place is
-- issued; a user asking is kept in the pre-queue (KEYS[5], scored by its
-- draw, which the service derives from the user under the room's secret:
-- the same at every ask and on every instance, unknown to the buyer). The
-- first call at or after the opening gives the pre-queue the first
-- places, in the order of the draws (a shuffle no early or repeated ask
-- changes), as one block: a pre-queued user's position is the block's
-- base plus its rank, issued when it next asks; who comes after the
-- opening is behind the block.
-- KEYS[1] the room (hash: seq, serving, at, sold_out, rate, cap, pre_base:
-- the places before the pre-queue's block, set at the opening), KEYS[2]
-- the users' places (hash: user -> "position:issued_ms"), KEYS[3] the
-- marks (sorted set: score the serving counter, member "ms:serving": when
-- the counter reached it), KEYS[4] when the counter passed each value
-- (sorted set, score ms, member the value), KEYS[5] the pre-queue (sorted
-- set: score the draw, member the user)
-- ARGV[1] the highest position the calling instance knows was issued (a
-- position is never issued twice, even after Redis lost its last
-- writes), ARGV[2] the turn (ms), ARGV[3] the opening (Redis ms; 0: none),
-- ARGV[4..] the users, each followed by its draw (an integer < 2^48)
-- Returns {serving (after this call), 1 if sold out (then no place is
-- taken), Redis's clock ms, then per user: position, issued ms, 1 if a new
-- place} -- before the opening each user's position is 0, its issued ms
-- the opening, and 1 if it joined the pre-queue with this call.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local BANK_MS = 100
local st = redis.call('hmget', KEYS[1], 'seq', 'serving', 'sold_out', 'at', 'rate', 'cap',
                     'pre_base')
local seq = math.max(tonumber(st[1]) or 0, tonumber(ARGV[1]) or 0)
local exact = tonumber(st[2]) or 0
local serving = math.floor(exact)
if (tonumber(st[3]) or 0) > 0 then return {serving, 1, now} end
local turn = tonumber(ARGV[2])
local opens = tonumber(ARGV[3]) or 0
local out = {serving, 0, now}
if opens > 0 and now < opens then          -- not open yet: the pre-queue
    for i = 4, #ARGV, 2 do
        out[#out + 1] = 0
        out[#out + 1] = opens
        out[#out + 1] = redis.call('zadd', KEYS[5], 'NX', ARGV[i + 1], ARGV[i])
    end
    return out
end
local base = tonumber(st[7])
local moved = false                      -- places issued: the counter may move
if opens > 0 and not base then
    -- The opening: the pre-queue's block of places, after those issued.
    base = seq
    seq = seq + redis.call('zcard', KEYS[5])
    redis.call('hset', KEYS[1], 'pre_base', base, 'seq', seq, 'at', now)
    st[4] = now                          -- the counter starts from here
    moved = true
end
local new = {}
for i = 4, #ARGV, 2 do
    local user = ARGV[i]
    local pos, iss, fresh
    local cur = redis.call('hget', KEYS[2], user)
    if not cur and base then             -- a place in the pre-queue's block
        local rank = redis.call('zrank', KEYS[5], user)
        if rank and base + rank + 1 <= seq then
            cur = (base + rank + 1) .. ':' .. opens
            redis.call('hset', KEYS[2], user, cur)
            fresh = 1
        end
    end
    if cur then
        pos, iss = string.match(cur, '^(%d+):(%d+)$')
        pos, iss = tonumber(pos), tonumber(iss)
        if pos and pos <= seq and pos <= serving then
            local m = redis.call('zrangebyscore', KEYS[3], pos, '+inf', 'LIMIT', 0, 1)
            local at = m[1] and tonumber(string.match(m[1], '^(%d+)'))
            if at ~= nil and at + turn < now then pos = nil end   -- its turn is over
        elseif pos and pos > seq then
            pos = nil                    -- a place of a line Redis lost
        end
    end
    if pos then
        out[#out + 1] = pos
        out[#out + 1] = iss
        out[#out + 1] = fresh or 0
    else
        seq = seq + 1
        new[#new + 1] = user
        new[#new + 1] = seq .. ':' .. now
        out[#out + 1] = seq
        out[#out + 1] = now
        out[#out + 1] = 1
    end
end
if #new > 0 then
    redis.call('hset', KEYS[2], unpack(new))
    redis.call('hset', KEYS[1], 'seq', seq)
    moved = true
end
if moved then
    -- The counter, by the rate over the time since it last moved (at most
    -- BANK_MS), up to the last place and the units' cap.
    local at, rate, cap = tonumber(st[4]), tonumber(st[5]) or 0, tonumber(st[6]) or -1
    if at and rate > 0 and now > at then
        local top = seq
        if cap >= 0 then top = math.min(top, cap) end
        local ns = math.min(top, exact + rate * math.min(now - at, BANK_MS) / 1000)
        if math.floor(ns) > serving then
            redis.call('zadd', KEYS[3], math.floor(ns), now .. ':' .. math.floor(ns))
            if redis.call('zcard', KEYS[3]) > 8192 then
                redis.call('zremrangebyrank', KEYS[3], 0, -8193)
            end
            redis.call('zadd', KEYS[4], now, math.floor(ns))
            redis.call('hset', KEYS[1], 'serving', string.format('%.3f', ns), 'at', now)
            serving = math.floor(ns)
            out[1] = serving
        end
    end
end
return out
