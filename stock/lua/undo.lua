-- undo.lua: gives back the units of a reserved order that will never be
-- committed. The pending record is the proof that the units are still out:
-- without it nothing happens, so repeating an undo (or undoing an order that
-- a rebuild already wiped) cannot create stock.
--
-- KEYS[1] pending   KEYS[2] users   KEYS[3] idem record of the order's key
-- KEYS[4] empty-segment bitmap   KEYS[5..] stock segments 0 .. n-1
-- ARGV[1] order_id
-- Returns 1 when units were given back, 0 when there was nothing to undo.
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return 0 end
-- Format 2 (docs/storage.md), or the JSON of format 1.
local r
if string.sub(rec, 1, 1) == '{' then
    r = cjson.decode(rec)
else
    local q, l, s, pos = string.match(rec, '^2|(%d+)|%d+|(%d)|([%d:,]*)|()')
    if not q then return redis.error_reply('unreadable pending record') end
    local f = {}
    for i = 1, 3 do
        local n, at = string.match(rec, '^(%d+):()', pos)
        if not n then return redis.error_reply('unreadable pending record') end
        f[i] = string.sub(rec, at, at + tonumber(n) - 1)
        pos = at + tonumber(n)
    end
    r = { q = tonumber(q), l = tonumber(l), s = s, u = f[2], k = f[3] }
end
for seg, q in string.gmatch(r.s, '(%d+):(%d+)') do
    local key = KEYS[5 + tonumber(seg)]
    -- A missing segment means the copy was lost: the rebuild counts these
    -- units already, so do not recreate the key.
    if key and redis.call('EXISTS', key) == 1 then
        if redis.call('INCRBY', key, q) > 0 then
            redis.call('SETBIT', KEYS[4], tonumber(seg), 0)
        end
    end
end
if r.l == 1 then
    if redis.call('HINCRBY', KEYS[2], r.u, -r.q) <= 0 then
        redis.call('HDEL', KEYS[2], r.u)
    end
end
if r.k ~= '' then
    local idem = redis.call('GET', KEYS[3])
    if idem and string.find(idem, '|' .. ARGV[1] .. '|', 1, true) then
        redis.call('DEL', KEYS[3])
    end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
