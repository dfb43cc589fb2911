-- lock_steps.lua: the `lock` strategy's steps on an event loop, as
-- functions of their keys and arguments (K, A), for the scripts that run
-- them: lock_read.lua (the take and the read), lock_write.lua (the fenced
-- write, then the release) and lock_pass.lua (`fair-lock`: a write, and
-- the lock handed to the next order of the same instance with its read).
-- They run after format.lua (lock_script_compose), whose functions take,
-- free and line up for the lock module's own lock, so a holder on the
-- blocking path (or another instance) and these exclude each other, and
-- the lock's format is written in lock/ only.

-- The take and the read (lock_read.lua says the keys, the arguments and
-- the reply). Reading under the lock also raises the segment's fence to
-- the token (as read.lua does), so a holder whose lease ran out cannot
-- write over this one's work.
--
-- `fair-lock` (A[5] > 0) takes the lock only as the head of its line
-- (lock/lock.h, FAIRNESS: the fair lock's format, format.lua's lock_fair_*):
-- otherwise the order keeps (or takes) its place, as a waiter that polls
-- (it does not listen on a wake channel), and its place lasts A[5] ms.
--
-- from: nil, or the owner id of the order that holds the lock and hands
-- it to this one (lock_pass.lua), so that no one else comes between the
-- two; then seen is the head of the line it saw: this order, or nil (none).
-- now: Redis's clock (ms) if the caller read it in this script, else nil.
local function lock_step_read(K, A, from, seen, now)
    local fair = A[5] ~= nil
    local head
    -- Redis's clock, read once a call (the line's dues and tickets).
    local function clock()
        if not now then now = lock_now_ms() end
        return now
    end
    -- After this order's own take or place: the orders behind it, into the line.
    local function behind()
        if not fair or #A < 8 then return end
        local ws = {}
        for i = 8, #A do ws[#ws + 1] = A[i] end
        lock_fair_join_all(K[8], K[9], ws, tonumber(A[5]), clock(), tonumber(A[6]))
    end
    if from then
        head = seen
    elseif fair then
        if redis.replicate_commands then redis.replicate_commands() end
        local free, pruned = lock_free(K[1]), 0
        head = lock_fair_head(K[8])
        -- An empty line: nothing to look at; this order at its head: no one is
        -- ahead of it to drop (those behind lapse at the release's prune).
        if head and head ~= A[1] then
            pruned = lock_fair_prune(K[8], K[9], K[10], clock())
            if pruned > 0 then head = lock_fair_head(K[8]) end
        end
        if not free or (head and head ~= A[1]) then
            if free and pruned > 0 then lock_fair_wake(K[8], K[9], K[10], A[7]) end
            local _, rank = lock_fair_stay(K[8], K[9], K[10], A[1], nil,
                                           tonumber(A[5]), clock(), tonumber(A[6]))
            behind()
            return {0, redis.call('PTTL', K[1]), rank}
        end
    elseif not lock_free(K[1]) then
        return {0, redis.call('PTTL', K[1])}
    end
    local g = redis.call('GET', K[3])
    local gen, run_id
    if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
    local v = redis.call('GET', K[6])
    if not g or run_id ~= A[3] or not v then
        -- Not taken: the lock is not handed on after all, but freed.
        if from then lock_fair_release(K[1], K[8], K[9], K[10], from, A[7]) end
        if fair then lock_fair_leave(K[1], K[8], K[9], K[10], A[1], A[7]) end
        behind()
        return {-3}                  -- not taken: no lock to release
    end
    local token = lock_take(K[1], K[2], A[1], A[2])
    -- In line only as its head (an empty line: never joined): out of it now.
    -- Its place only: an order of the service polls, it is never marked as
    -- listening (sub), so there is nothing of it to take out there.
    if head then lock_fair_drop(K[8], K[9], nil, A[1]) end
    behind()
    if tonumber(redis.call('GET', K[7]) or '0') < token then
        redis.call('SET', K[7], token)
    end
    return {1, token, tonumber(gen), tonumber(redis.call('HGET', K[4], A[4]) or '0'),
            redis.call('GET', K[5]) or '', tonumber(v)}
end

-- The fenced write of the read-check-write, when the check passed
-- (lock_write.lua says the keys, the arguments and the reply); the release
-- is its caller's. The write takes the units the read checked (DECRBY:
-- units given back meanwhile without the lock stay), and is refused whole
-- when a newer holder has raised the segment's fence (this holder's lease
-- ran out). Returns the reply, and Redis's clock in ms if it read it.
local function lock_step_write(K, A)
    local res = {0}
    local now                          -- Redis's clock (ms), once read
    if A[6] ~= 'write' then return res, nil end
    local g = redis.call('GET', K[3])
    local gen, run_id
    if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
    if not g or run_id ~= A[3] or gen ~= A[4] then
        return {-3}, nil
    elseif tonumber(A[5]) < tonumber(redis.call('GET', K[9]) or '0') then
        return {-4}, nil
    end
    -- The units taken come off what is there now, which is what the read
    -- saw plus whatever came back meanwhile (a restock, an undo, a hold
    -- ended: they add without the lock). The fence above keeps other
    -- holders out; setting the value computed from the read would erase
    -- those returns.
    local left = redis.call('DECRBY', K[8], A[10])
    if tonumber(A[8]) > 1 then
        redis.call('SETBIT', K[7], A[7], (left <= 0) and 1 or 0)
    end
    local limit = tonumber(A[13])
    if limit > 0 then redis.call('HINCRBY', K[5], A[12], A[10]) end
    local spec = A[7] .. ':' .. A[10]
    local t = redis.call('TIME')
    local us = t[2]
    now = t[1] .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
    -- Pending record, format 2 (docs/storage.md).
    redis.call('HSET', K[4], A[11], '2|' .. A[10] .. '|' .. now .. '|' ..
        ((limit > 0) and '1' or '0') .. '|' .. spec .. '|' .. #A[16] .. ':' .. A[16] ..
        A[17])
    if A[14] ~= '' then
        redis.call('SET', K[6], gen .. '|' .. A[11] .. '|' .. A[14], 'PX', A[15])
    end
    return {1, tonumber(gen), spec}, tonumber(now)
end
