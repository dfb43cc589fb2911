-- load.lua: (re)builds the Redis copy of one SKU's stock from SQLite's
-- numbers, atomically, under a new generation.
--
-- KEYS[1] gen   KEYS[2] pending   KEYS[3] users   KEYS[4] empty-segment bitmap
-- KEYS[5] returned (return.lua's legacy markers)   KEYS[6..] segments 0 .. n-1
-- ARGV[1] generation   ARGV[2] run_id   ARGV[3] "1" to overwrite any copy
-- ARGV[4 .. 3+n] units per segment, then user_id, units pairs
-- Returns 1 when loaded, 0 when a copy of this or a newer generation built
-- for this Redis is already there (another instance rebuilt it first).
local n = #KEYS - 5
if ARGV[3] ~= '1' then
    local cur = redis.call('GET', KEYS[1])
    if cur then
        local g, run_id = string.match(cur, '^(%d+):(.*)$')
        if run_id == ARGV[2] and tonumber(g) >= tonumber(ARGV[1]) then return 0 end
    end
end
-- Pending records belong to older generations now: their orders cannot
-- commit (SQLite refuses the old generation), and their units are already
-- in the numbers loaded here. So are the units of holds ended before this
-- rebuild read SQLite: the legacy markers go with the copy they were made
-- in. The time buckets of markers (returned:<b>) and their watermark
-- (returned:before) stay: a return of an older generation answers 0 before
-- return.lua looks at either, and forget.lua drops the buckets by age.
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
for i = 1, n do
    redis.call('SET', KEYS[5 + i], ARGV[3 + i])
    if n > 1 and tonumber(ARGV[3 + i]) == 0 then redis.call('SETBIT', KEYS[4], i - 1, 1) end
end
for i = 4 + n, #ARGV, 2 do
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
return 1
