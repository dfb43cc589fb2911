-- room_tick.lua: one instance's beat of a product's waiting room
-- (stock/room.h): it says what it can take, the serving counter moves on
-- at the rate all instances together take (never past the last place
-- issued), and it hears back where the room is.
-- KEYS[1] the room (hash), KEYS[2] the marks (sorted set), KEYS[3] the
-- instances' rates (hash: instance -> "orders/s:ms"), KEYS[4] the places
-- done (a bitmap: bit p set once position p's order had its final
-- answer), KEYS[5] when the counter passed each value (sorted set, score
-- ms, member the value), KEYS[6..] the product's stock keys (none when
-- its stock is not in this slot: then no cap by the units left)
-- ARGV[1] instance, ARGV[2] its rate (orders/s; 0: says nothing), ARGV[3]
-- the room's fixed rate (0: the sum of the instances' fresh rates),
-- ARGV[4] the serving counter up to which the instance has the marks,
-- ARGV[5] the highest place it knows was issued, ARGV[6] the highest
-- serving counter it saw (a Redis that lost its last writes never goes
-- back below either), ARGV[7] 'sold_out' (its store said nothing is left),
-- 'reopen' (units came back) or '', ARGV[8] the most marks to return,
-- ARGV[9] the turn (ms), ARGV[10] the places whose orders this instance
-- answered finally since its last beat, comma-separated
--
-- The cap by the units left: the positions in their turn and not done
-- (admitted within the last turn, no final answer yet) hold a unit each;
-- the counter admits no more than the units left beyond them. So a buyer
-- in its turn finds its unit whenever it comes within its turn -- a bot
-- that asks at once cannot take it -- and the sale's last units go to the
-- first arrivals. A turn that passes unused frees its unit.
-- Returns {seq, serving (a decimal), Redis's clock ms, the rate (a
-- decimal), sold out since ms (0: open), {mark, ms, mark, ms, ...}}.
if redis.replicate_commands then redis.replicate_commands() end
local turn = tonumber(ARGV[9]) or 30000
for p in string.gmatch(ARGV[10] or '', '%d+') do redis.call('setbit', KEYS[4], tonumber(p), 1) end
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
-- The units left (nil: not known here -- a copy not loaded yet, or not
-- a number).
local left = nil
if #KEYS > 5 then
    left = 0
    for i = 6, #KEYS do
        local v = tonumber(redis.call('get', KEYS[i]))
        if not v then left = nil break end
        left = left + math.max(v, 0)
    end
end
-- Nothing left in the stock: the room is sold out (every waiting ticket
-- hears so, though no order of theirs asked the stock); units back in it
-- (an undo, a return, a restock) open it again.
if left and left <= 0 and sold == 0 then sold = now end
if left and left > 0 and sold > 0 then sold = 0 end
local cap = seq
local ucap = -1                  -- the cap by the units alone (-1: none), for room_take.lua
if left then
    -- The positions admitted before the last turn are done or over.
    local old = redis.call('zrevrangebyscore', KEYS[5], now - turn, '-inf', 'LIMIT', 0, 1)
    local from = math.floor(tonumber(old[1]) or 0)
    local s0 = math.floor(serving)
    local held = 0
    if s0 > from then
        held = (s0 - from) - redis.call('bitcount', KEYS[4], from + 1, s0, 'BIT')
    end
    ucap = s0 + math.max(left - held, 0)
    cap = math.min(seq, ucap)
end
if now > at then
    local ns = math.min(cap, serving + rate * (now - at) / 1000)
    if ns < serving then ns = serving end
    if math.floor(ns) > math.floor(serving) then
        redis.call('zadd', KEYS[2], math.floor(ns), now .. ':' .. math.floor(ns))
        if redis.call('zcard', KEYS[2]) > 8192 then redis.call('zremrangebyrank', KEYS[2], 0, -8193) end
        redis.call('zadd', KEYS[5], now, math.floor(ns))
        redis.call('zremrangebyscore', KEYS[5], '-inf', now - turn - 60000)
    end
    serving = ns
    at = now
end
redis.call('hset', KEYS[1], 'seq', seq, 'serving', string.format('%.3f', serving), 'at', at,
           'sold_out', sold, 'rate', string.format('%.3f', rate), 'cap', ucap)
local marks = redis.call('zrangebyscore', KEYS[2], '(' .. (tonumber(ARGV[4]) or 0), '+inf',
                         'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[8]) or 1024)
local flat = {}
for i = 1, #marks, 2 do
    flat[#flat + 1] = tonumber(marks[i + 1])
    flat[#flat + 1] = tonumber(string.match(marks[i], '^(%d+)'))
end
return {seq, string.format('%.3f', serving), now, string.format('%.3f', rate), sold, flat}
