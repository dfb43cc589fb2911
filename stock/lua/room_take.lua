-- room_take.lua: a buyer takes its place in a product's waiting room
-- (stock/room.h): one place per user; the place it has is given back as
-- it is, unless its turn is over (then a new one at the back).
-- KEYS[1] the room (hash: seq, serving, at, sold_out, rate), KEYS[2] the
-- users' places (hash: user -> "position:issued_ms"), KEYS[3] the marks
-- (sorted set: score the serving counter, member "ms:serving": when the
-- counter reached it)
-- ARGV[1] user, ARGV[2] the highest position the calling instance knows was
-- issued (a position is never issued twice, even after Redis lost its last
-- writes), ARGV[3] the turn (ms)
-- Returns {position (0: sold out, no place), issued ms, serving, 1 if a new
-- place, 1 if sold out, Redis's clock ms}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('hmget', KEYS[1], 'seq', 'serving', 'sold_out')
local seq = tonumber(st[1]) or 0
local serving = math.floor(tonumber(st[2]) or 0)
if (tonumber(st[3]) or 0) > 0 then return {0, 0, serving, 0, 1, now} end
local cur = redis.call('hget', KEYS[2], ARGV[1])
if cur then
    local pos, iss = string.match(cur, '^(%d+):(%d+)$')
    pos, iss = tonumber(pos), tonumber(iss)
    if pos and pos <= seq then
        local over = false
        if pos <= serving then
            local m = redis.call('zrangebyscore', KEYS[3], pos, '+inf', 'LIMIT', 0, 1)
            local at = m[1] and tonumber(string.match(m[1], '^(%d+)'))
            over = at ~= nil and at + tonumber(ARGV[3]) < now
        end
        if not over then return {pos, iss, serving, 0, 0, now} end
    end
end
local floor = tonumber(ARGV[2]) or 0
if seq < floor then seq = floor end
seq = seq + 1
redis.call('hset', KEYS[1], 'seq', seq)
redis.call('hset', KEYS[2], ARGV[1], seq .. ':' .. now)
return {seq, now, serving, 1, 0, now}
