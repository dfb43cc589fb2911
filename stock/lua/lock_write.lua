-- lock_write.lua: the `lock` strategy's second round trip: the fenced write
-- of the read-check-write (when the check passed), then the release of the
-- lock, in one atomic step. The write takes the units the read checked
-- (DECRBY: units given back meanwhile without the lock stay), and is
-- refused whole when a newer holder has raised the segment's fence (this
-- holder's lease ran out). The release
-- is the lock module's (lock/lua/format.lua's lock_release, which this body
-- follows in one script): compare-and-delete, then wake the next live
-- waiter of the blocking path, as lock_release does.
--
-- KEYS[1] lock   KEYS[2] the lock's waiter queue   KEYS[3] gen   KEYS[4] pending
-- KEYS[5] users   KEYS[6] idem record   KEYS[7] empty-segment bitmap
-- KEYS[8] the segment's stock   KEYS[9] the segment's fence
-- KEYS[10..12] `fair-lock`'s line: queue, due, sub (with ARGV[18]; `lock`: neither)
-- ARGV[1] owner id   ARGV[2] wake channel prefix   ARGV[3] run_id   ARGV[4] gen read
-- ARGV[5] token   ARGV[6] 'write' or 'release' (the check refused: release only)
-- ARGV[7] segment index   ARGV[8] segments   ARGV[9] the value the read implies (not
-- written: see the write below)   ARGV[10] units taken
-- ARGV[11] order_id   ARGV[12] user_id   ARGV[13] per-user limit   ARGV[14] fingerprint
-- ARGV[15] idem TTL ms   ARGV[16] instance   ARGV[17] pending record tail
-- ARGV[18] '1': fair-lock (its release wakes the head of its line); absent: `lock`
-- Returns {1, gen, spec} written, {0} released only, {-3} copy gone or rebuilt,
-- {-4} fenced off (a newer holder wrote): nothing written in those two.
local res = {0}
local now                          -- Redis's clock (ms), once read
if ARGV[6] == 'write' then
    local g = redis.call('GET', KEYS[3])
    local gen, run_id
    if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
    if not g or run_id ~= ARGV[3] or gen ~= ARGV[4] then
        res = {-3}
    elseif tonumber(ARGV[5]) < tonumber(redis.call('GET', KEYS[9]) or '0') then
        res = {-4}
    else
        -- The units taken come off what is there now, which is what the read
        -- saw plus whatever came back meanwhile (a restock, an undo, a hold
        -- ended: they add without the lock). The fence above keeps other
        -- holders out; setting the value computed from the read would erase
        -- those returns.
        local left = redis.call('DECRBY', KEYS[8], ARGV[10])
        if tonumber(ARGV[8]) > 1 then
            redis.call('SETBIT', KEYS[7], ARGV[7], (left <= 0) and 1 or 0)
        end
        local limit = tonumber(ARGV[13])
        if limit > 0 then redis.call('HINCRBY', KEYS[5], ARGV[12], ARGV[10]) end
        local spec = ARGV[7] .. ':' .. ARGV[10]
        local t = redis.call('TIME')
        local us = t[2]
        now = t[1] .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
        -- Pending record, format 2 (docs/storage.md).
        redis.call('HSET', KEYS[4], ARGV[11], '2|' .. ARGV[10] .. '|' .. now .. '|' ..
            ((limit > 0) and '1' or '0') .. '|' .. spec .. '|' .. #ARGV[16] .. ':' .. ARGV[16] ..
            ARGV[17])
        if ARGV[14] ~= '' then
            redis.call('SET', KEYS[6], gen .. '|' .. ARGV[11] .. '|' .. ARGV[14], 'PX', ARGV[15])
        end
        res = {1, tonumber(gen), spec}
    end
end
if ARGV[18] == '1' then
    lock_fair_release(KEYS[1], KEYS[10], KEYS[11], KEYS[12], ARGV[1], ARGV[2], now and tonumber(now))
else
    lock_release(KEYS[1], KEYS[2], ARGV[1], ARGV[2], 1)
end
return res
