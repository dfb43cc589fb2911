-- room_tick.lua: one instance's beat of a product's waiting room
-- (stock/room.h): it says what it can take, the serving counter moves on
-- at the rate all instances together take (never past the last place
-- issued), and it hears back where the room is.
-- KEYS[1] the room (hash), KEYS[2] the marks (sorted set), KEYS[3] the
-- instances' rates (hash: instance -> "orders/s:ms")
-- ARGV[1] instance, ARGV[2] its rate (orders/s; 0: says nothing), ARGV[3]
-- the room's fixed rate (0: the sum of the instances' fresh rates),
-- ARGV[4] the serving counter up to which the instance has the marks,
-- ARGV[5] the highest place it knows was issued, ARGV[6] the highest
-- serving counter it saw (a Redis that lost its last writes never goes
-- back below either), ARGV[7] 'sold_out' (its store said nothing is left),
-- 'reopen' (units came back) or '', ARGV[8] the most marks to return
-- Returns {seq, serving (a decimal), Redis's clock ms, the rate (a
-- decimal), sold out since ms (0: open), {mark, ms, mark, ms, ...}}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('hmget', KEYS[1], 'seq', 'serving', 'at', 'sold_out')
local seq = math.max(tonumber(st[1]) or 0, tonumber(ARGV[5]) or 0)
local serving = math.max(tonumber(st[2]) or 0, tonumber(ARGV[6]) or 0)
local at = tonumber(st[3]) or now
local sold = tonumber(st[4]) or 0
if ARGV[7] == 'sold_out' and sold == 0 then sold = now elseif ARGV[7] == 'reopen' then sold = 0 end
local mine = tonumber(ARGV[2]) or 0
if mine > 0 then redis.call('hset', KEYS[3], ARGV[1], string.format('%.3f:%d', mine, now)) end
local rate = tonumber(ARGV[3]) or 0
if rate <= 0 then
    rate = 0
    local all = redis.call('hgetall', KEYS[3])
    for i = 1, #all, 2 do
        local r, ms = string.match(all[i + 1], '^([%d.]+):(%d+)$')
        ms = tonumber(ms)
        if ms and now - ms <= 2000 then
            rate = rate + tonumber(r)
        elseif not ms or now - ms > 60000 then
            redis.call('hdel', KEYS[3], all[i])
        end
    end
end
if now > at then
    local ns = math.min(seq, serving + rate * (now - at) / 1000)
    if ns < serving then ns = serving end
    if math.floor(ns) > math.floor(serving) then
        redis.call('zadd', KEYS[2], math.floor(ns), now .. ':' .. math.floor(ns))
        if redis.call('zcard', KEYS[2]) > 8192 then redis.call('zremrangebyrank', KEYS[2], 0, -8193) end
    end
    serving = ns
    at = now
end
redis.call('hset', KEYS[1], 'seq', seq, 'serving', string.format('%.3f', serving), 'at', at,
           'sold_out', sold, 'rate', string.format('%.3f', rate))
local marks = redis.call('zrangebyscore', KEYS[2], '(' .. (tonumber(ARGV[4]) or 0), '+inf',
                         'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[8]) or 1024)
local flat = {}
for i = 1, #marks, 2 do
    flat[#flat + 1] = tonumber(marks[i + 1])
    flat[#flat + 1] = tonumber(string.match(marks[i], '^(%d+)'))
end
return {seq, string.format('%.3f', serving), now, string.format('%.3f', rate), sold, flat}
