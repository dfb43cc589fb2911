-- restock.lua: adds units to a valid stock copy, spread evenly over the
-- segments (the emptiest get the remainder first).
--
-- KEYS[1] gen   KEYS[2] empty-segment bitmap   KEYS[3..] segments 0 .. n-1
-- ARGV[1] run_id   ARGV[2] units to add
-- Returns 1, or -3 when there is no valid copy (the rebuild will count the
-- units, which SQLite already has).
local g = redis.call('GET', KEYS[1])
if not g then return -3 end
local run_id = string.match(g, '^%d+:(.*)$')
if run_id ~= ARGV[1] then return -3 end
local n = #KEYS - 2
local qty = tonumber(ARGV[2])
local base, rest = math.floor(qty / n), qty % n
local order = {}
for i = 1, n do
    order[i] = { i, tonumber(redis.call('GET', KEYS[2 + i]) or '0') }
end
table.sort(order, function(a, b) return a[2] < b[2] end)
for j = 1, n do
    local add = base + ((j <= rest) and 1 or 0)
    if add > 0 then
        if redis.call('INCRBY', KEYS[2 + order[j][1]], add) > 0 then
            redis.call('SETBIT', KEYS[2], order[j][1] - 1, 0)
        end
    end
end
return 1
