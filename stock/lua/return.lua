-- return.lua: gives the units of an ended hold (cancelled or expired) back
-- to the stock copy, exactly once.
--
-- SQLite decided the hold's end and recorded the stock generation it was
-- decided under (db/holds.h). That generation says which copy owes the
-- units: an older copy (a rebuild under way) must wait for the new one, and
-- a newer copy was built from SQLite after the decision and counts them
-- already. In the copy of that generation a marker per order makes a
-- repeat (a retry, a second instance, a replay of the sweep) add nothing.
--
-- Markers are forgotten by time, so that a long sale's million ended holds
-- do not stay in Redis (forget.lua). The marker of an order decided at
-- decided_ms (the deciding instance's wall clock, as SQLite recorded it) is
-- a field of the bucket `returned:<decided_ms / STOCK_RETURNED_BUCKET_MS>`
-- (stock.h), its value decided_ms. The watermark `returned:before` = W
-- says: every order decided before W was given back and its debt cleared,
-- and its marker may be gone. So a return decided before W is a repeat of
-- one done and forgotten: -6, and nothing changes (were it a first return,
-- its decision's clock was behind the others' by more than the keep
-- margin: the caller keeps the debt and says so, rather than give twice).
-- The watermark is checked before the marker, and forget.lua raises it
-- before it deletes, in one script: a repeat never finds its marker gone
-- and the watermark not yet past it.
--
-- The legacy hash `returned` (markers "1", written before buckets; no
-- decided time) is still read: one of its orders repeated now must not be
-- given again into a bucket. It is no longer written, and load.lua deletes
-- it with the copy as before.
--
-- Where the units go: back to the segments they came from when this copy
-- is the one they were taken from; a copy rebuilt since spread its units
-- evenly, and these are spread like a restock (the emptiest first).
--
-- KEYS[1] gen   KEYS[2] returned (legacy markers, read only)   KEYS[3] users
-- KEYS[4] empty-segment bitmap   KEYS[5] returned:<bucket of decided_ms>
-- KEYS[6] returned:before (the watermark)   KEYS[7..] segments 0 .. n-1
-- ARGV[1] run_id   ARGV[2] generation decided under   ARGV[3] generation reserved under
-- ARGV[4] order_id   ARGV[5] takes ("<segment>:<units>,..."; '' unknown)
-- ARGV[6] units   ARGV[7] user_id   ARGV[8] 1: the buyer is counted in `users`
-- ARGV[9] decided_ms
-- Returns 1 given back now, 0 nothing to do (given back before, or counted
-- by a rebuild), -3 no valid copy (a rebuild will count them: retry after
-- it), -5 the copy is older than the decision (retry once it is rebuilt),
-- -6 decided before the watermark: given back before and forgotten.
local g = redis.call('GET', KEYS[1])
if not g then return -3 end
local gen, run_id = string.match(g, '^(%d+):(.*)$')
if run_id ~= ARGV[1] then return -3 end
gen = tonumber(gen)
local decided = tonumber(ARGV[2])
if gen < decided then return -5 end
if gen > decided then return 0 end
local w = tonumber(redis.call('GET', KEYS[6]) or '0')
if tonumber(ARGV[9]) < w then return -6 end
if redis.call('HEXISTS', KEYS[2], ARGV[4]) == 1 then return 0 end
if redis.call('HSETNX', KEYS[5], ARGV[4], ARGV[9]) == 0 then return 0 end

local n = #KEYS - 6
local q = tonumber(ARGV[6])
local function give(seg, units)
    if redis.call('INCRBY', KEYS[7 + seg], units) > 0 then
        redis.call('SETBIT', KEYS[4], seg, 0)
    end
end
local placed = false
if gen == tonumber(ARGV[3]) and ARGV[5] ~= '' then
    local sum, ok = 0, true
    for seg, u in string.gmatch(ARGV[5], '(%d+):(%d+)') do
        if tonumber(seg) >= n then ok = false end
        sum = sum + tonumber(u)
    end
    if ok and sum == q then
        for seg, u in string.gmatch(ARGV[5], '(%d+):(%d+)') do give(tonumber(seg), tonumber(u)) end
        placed = true
    end
end
if not placed then
    local order = {}
    for i = 1, n do order[i] = { i - 1, tonumber(redis.call('GET', KEYS[6 + i]) or '0') } end
    table.sort(order, function(a, b) return a[2] < b[2] end)
    local base, rest = math.floor(q / n), q % n
    for j = 1, n do
        local add = base + ((j <= rest) and 1 or 0)
        if add > 0 then give(order[j][1], add) end
    end
end
if ARGV[8] == '1' then
    if redis.call('HINCRBY', KEYS[3], ARGV[7], -q) <= 0 then redis.call('HDEL', KEYS[3], ARGV[7]) end
end
return 1
