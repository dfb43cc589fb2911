-- format.lua: the lock's Redis format (lock/lock.h, THE FORMAT) and the
-- fence's (lock.h, FENCING), written once, as Lua local functions. Every
-- script that touches a lock or a fence is this file followed by its own
-- body (lock_script_compose): the lock module's acquire, release, extend,
-- settle and fence, and scripts of other modules that take or free a lock
-- or pass a fence inside their own atomic step (the stock module's
-- lock_read, lock_write, read and write), so they all agree on what a lock
-- and a fence are.
-- It only defines functions: nothing runs until the body calls them, so a
-- body may still begin with redis.replicate_commands().
--
-- lock is the lock's key (NAME), fence its token counter (B:fence), queue
-- its waiter queue (B:waiters), wake its wake channel prefix (B:wake:); the
-- caller passes them in KEYS, as Redis Cluster wants (B:incarnation too).

-- The value of a lock held by owner id with fencing token token.
local function lock_value(id, token)
    return id .. ':' .. token
end

-- Whether no one holds the lock.
local function lock_free(lock)
    return redis.call('exists', lock) == 0
end

-- Takes a free lock for owner id, with a lease of ttl ms: the next token
-- from the counter (which never expires, so tokens never go back), then
-- SET "<id>:<token>" PX. Returns the token.
local function lock_take(lock, fence, id, ttl)
    local token = redis.call('incr', fence)
    redis.call('set', lock, lock_value(id, token), 'px', ttl)
    return token
end

-- The incarnation this server's token counter belongs to (B:incarnation,
-- lock.h): the one stored, or on a server that has none (new, or it lost
-- its data, counter and all) the caller's proposal (16 random hex digits),
-- stored now. Run in the same step as lock_take, so that the token and the
-- incarnation handed out with it come from the same data.
local function lock_incarnation(key, proposal)
    local inc = redis.call('get', key)
    if inc then return inc end
    redis.call('set', key, proposal)
    return proposal
end

-- Whether the lock is held by owner id: its value starts with "<id>:".
local function lock_ours(lock, id)
    local v = redis.call('get', lock)
    if not v then return false end
    return string.sub(v, 1, #id + 1) == id .. ':'
end

-- Compare-and-delete: frees the lock if owner id holds it, then wakes up to
-- want live waiters. The marker published first on the bare prefix tells
-- clients that watch the key's keyspace notifications that this DEL is one
-- of ours, whose queue wakes a waiter below; they ignore its del event.
-- Waiters whose PUBLISH reaches nobody have gone; they are dropped, but at
-- most 64 per release, so a queue of dead entries cannot stall Redis.
-- Returns 1 freed, 0 not ours (expired, or someone else's lock).
local function lock_release(lock, queue, id, wake, want)
    if not lock_ours(lock, id) then
        return 0
    end
    redis.call('publish', wake, 'released')
    redis.call('del', lock)
    local woke = 0
    for _ = 1, 64 do
        if woke >= want then break end
        local head = redis.call('zpopmin', queue)
        if #head == 0 then break end
        if redis.call('publish', wake .. head[1], 'released') > 0 then
            woke = woke + 1
        end
    end
    return 1
end

-- ----------------------------------------------------------------- fences
--
-- The fence of a resource (lock.h, FENCING): the protected side's record of
-- the holders it has seen, one key per resource, so that a holder whose
-- lease ran out cannot act after a newer holder. A holder is known by its
-- incarnation (16 lowercase hex digits: the lock service's, lock.h) and
-- its token (decimal), strictly increasing within one incarnation.
--
-- The value, in one of two forms:
--   "<hi>"                    the old form: epoch 0, one incarnation (the
--                             unnamed one, LOCK_UNNAMED), highest token hi.
--                             A missing key is "0". Kept as long as only
--                             unnamed tokens come (the `lock` strategy,
--                             lock_fenced_set with incarnation 0).
--   "<epoch>:<hi>:<i1>,...,<iK>"
--                             i1..iK the incarnations seen, in order of
--                             first use (iK the newest), the last
--                             LOCK_FENCE_KEEP of them; hi the highest token
--                             of iK; epoch how many times a new incarnation
--                             was admitted (never goes back).
--
-- Incarnations are ordered by first use, tokens within one incarnation by
-- value: a holder of the newest incarnation is admitted with a token >= hi
-- (raising hi); of an incarnation not in the list, always (it becomes the
-- newest and the epoch goes up: the lock service lost its data and started
-- over, lower); of an older one in the list, never.

local LOCK_UNNAMED = '0000000000000000'
local LOCK_FENCE_KEEP = 8

-- A fence value read: epoch, highest token (a number), incarnations
-- (oldest first). Raises an error on a value in neither form: nothing is
-- admitted past a fence it cannot read.
local function lock_fence_parse(v)
    if not v then return 0, 0, {LOCK_UNNAMED} end
    if string.match(v, '^%d+$') then return 0, tonumber(v), {LOCK_UNNAMED} end
    local e, hi, list = string.match(v, '^(%d+):(%d+):([%x,]+)$')
    if not e then error('fence: unreadable value: ' .. string.sub(v, 1, 80)) end
    local incs = {}
    for x in string.gmatch(list, '%x+') do incs[#incs + 1] = x end
    return tonumber(e), tonumber(hi), incs
end

-- Writes a fence value; tok is the highest token, as the decimal string the
-- holder sent (exact, whatever its size).
local function lock_fence_store(key, e, tok, incs)
    if e == 0 then
        redis.call('set', key, tok)
    else
        redis.call('set', key, string.format('%d', e) .. ':' .. tok .. ':' ..
            table.concat(incs, ','))
    end
end

-- Admits the holder (inc, tok) at the fence key: its read under the lock,
-- or a one-step fenced write. Returns the epoch the fence is at afterwards
-- (the holder's later write must carry it: lock_fence_check), or nil when
-- refused (a newer holder, or a newer incarnation, has been here). With
-- dry, only says so: nothing changes (a caller admitted at several fences
-- asks them all first).
local function lock_fence_admit(key, inc, tok, dry)
    local e, hi, incs = lock_fence_parse(redis.call('get', key))
    local t = tonumber(tok)
    if inc == incs[#incs] then
        if t < hi then return nil end
        if t > hi and not dry then lock_fence_store(key, e, tok, incs) end
        return e
    end
    for i = 1, #incs - 1 do
        if incs[i] == inc then return nil end
    end
    if dry then return e + 1 end
    incs[#incs + 1] = inc
    while #incs > LOCK_FENCE_KEEP do table.remove(incs, 1) end
    lock_fence_store(key, e + 1, tok, incs)
    return e + 1
end

-- Whether the holder (inc, tok), admitted at epoch e, may still write: no
-- other holder has been admitted since (the epoch, the newest incarnation
-- and the highest token are still its own). Changes nothing.
local function lock_fence_check(key, inc, tok, e)
    local fe, hi, incs = lock_fence_parse(redis.call('get', key))
    return fe == tonumber(e) and inc == incs[#incs] and tonumber(tok) >= hi
end

-- After a write lock_fence_check allowed: records tok as the highest token
-- if it is higher (it is not, after the holder's own admission; kept so a
-- write is never below what its own fence says).
local function lock_fence_record(key, inc, tok)
    local e, hi, incs = lock_fence_parse(redis.call('get', key))
    if inc == incs[#incs] and tonumber(tok) > hi then lock_fence_store(key, e, tok, incs) end
end

-- ------------------------------------------------------------ the fair queue
--
-- A fair lock (lock.h, FAIRNESS) is the same lock value, taken only by the
-- head of its queue: a newcomer never takes a lock that has waiters. Its
-- keys (the caller passes them in KEYS):
--   queue  sorted set: the waiters in arrival order (score: a ticket,
--          lock_fair_ticket);
--   due    sorted set: when each waiter's place lapses (server ms). Every
--          call of a waiter moves its due to now + its lease, so a waiter
--          that stops calling (killed, stopped, cut off) loses its place
--          by then, wherever it is in the queue;
--   sub    set: the waiters that listen on their wake channel. A PUBLISH
--          to one of them that reaches nobody means it has gone (its
--          connection closed): it is dropped at once. A waiter there as
--          '~' .. id listens where a PUBLISH cannot count it (on a Redis
--          Cluster a PUBLISH counts only its own node's listeners, and
--          reaches the others' through the cluster bus): it is woken, and
--          left to its due. Waiters in neither form (not subscribed yet,
--          or polling) are left to their due.

-- Redis's clock, in ms: the dues are all of this one server's clock.
local function lock_now_ms()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Takes waiter w out of the queue. sub nil: w is known never to listen
-- (an order of the service, which polls): nothing of it there.
local function lock_fair_drop(queue, due, sub, w)
    redis.call('zrem', queue, w)
    redis.call('zrem', due, w)
    if sub then redis.call('srem', sub, w, '~' .. w) end
end

-- Drops the waiters whose place has lapsed (at most 64 per call, so that a
-- queue of the dead cannot stall Redis). Returns how many.
local function lock_fair_prune(queue, due, sub, now)
    local gone = redis.call('zrangebyscore', due, '-inf', '(' .. now, 'limit', 0, 64)
    for _, w in ipairs(gone) do lock_fair_drop(queue, due, sub, w) end
    return #gone
end

-- The waiter at the head of the queue, or nil.
local function lock_fair_head(queue)
    return redis.call('zrange', queue, 0, 0)[1]
end

-- Wakes the head, and only the head: one PUBLISH on its channel. A head
-- that listens (sub) but whose PUBLISH reached nobody has gone: dropped,
-- and the next one woken (at most 64 per call). A head that does not
-- listen (it polls, or is subscribing and not marked yet) is left to come
-- by itself, unpublished to: the service's orders poll, and a PUBLISH to
-- each of them was a command an order for nothing. head: the queue's
-- head if the caller has just read it (nil: read here).
local function lock_fair_wake(queue, due, sub, wake, head)
    for _ = 1, 64 do
        head = head or lock_fair_head(queue)
        if not head then return end
        local heard = redis.call('smismember', sub, head, '~' .. head)
        if heard[1] == 0 and heard[2] == 0 then return end
        if redis.call('publish', wake .. head, 'released') > 0 or heard[1] == 0 then return end
        lock_fair_drop(queue, due, sub, head)
        head = nil
    end
end

-- The fair lock's compare-and-delete: frees the lock if owner id holds it
-- (the marker on wake first, as lock_release), then wakes the head of the
-- queue, the lapsed places dropped first. now: Redis's clock in ms if the
-- caller has read it (nil: read here). Returns 1 freed, 0 not ours.
local function lock_fair_release(lock, queue, due, sub, id, wake, now)
    if not lock_ours(lock, id) then
        return 0
    end
    redis.call('publish', wake, 'released')
    redis.call('del', lock)
    local head = lock_fair_head(queue)
    if head then                               -- no line, no one to wake
        if lock_fair_prune(queue, due, sub, now or lock_now_ms()) > 0 then head = nil end
        lock_fair_wake(queue, due, sub, wake, head)
    end
    return 1
end

-- The ticket after the last one in the queue: one more, or the server's
-- clock (ms x 1000) when that is higher -- so that tickets rise across a
-- line that empties and starts again too (as long as the line takes fewer
-- than 1,000 places a millisecond and the server's clock does not step
-- back while it is empty), and a ticket says the order the server saw
-- its places taken in (lock_ticket). Exact in a double (< 2^53). Second:
-- whether the queue was empty.
local function lock_fair_ticket(queue, now)
    local last = redis.call('zrange', queue, -1, -1, 'withscores')
    return math.max((tonumber(last[2]) or 0) + 1, now * 1000), #last == 0
end

-- Waiter w gives up its place (its wait ran out, or it failed); if it was
-- the head of a free lock, the next one is woken in its stead.
local function lock_fair_leave(lock, queue, due, sub, w, wake)
    local was_head = lock_fair_head(queue) == w
    lock_fair_drop(queue, due, sub, w)
    if was_head and lock_free(lock) then lock_fair_wake(queue, due, sub, wake) end
end

-- Several new waiters at the back, in the order given (a whole loop turn's
-- arrivals of one instance at once: two ZADDs, not a call each), none of
-- them in line yet; their places last lease ms from now.
local function lock_fair_join_all(queue, due, ws, lease, now, keep_ms)
    if #ws == 0 then return end
    local t, fresh = lock_fair_ticket(queue, now)
    local qa, da = {}, {}
    for i, w in ipairs(ws) do
        qa[#qa + 1] = t + i - 1
        qa[#qa + 1] = w
        da[#da + 1] = now + lease
        da[#da + 1] = w
    end
    redis.call('zadd', queue, 'NX', unpack(qa))
    redis.call('zadd', due, unpack(da))
    -- A line that was empty starts now: its keys' lives are set without
    -- asking them first (a line of a segment empties and starts again
    -- often: two PTTLs a time were a command an order).
    for _, k in ipairs({queue, due}) do
        if fresh or redis.call('pttl', k) < keep_ms then redis.call('pexpire', k, keep_ms) end
    end
end

-- A waiter's call on a fair lock that it could not take: joins the queue at
-- the back if not in it (joined = 1: a new place; a waiter that lost its
-- place gets a new one, at the back), moves its due to now + lease, marks
-- it listening as it says (listens: '1' listens, '2' listens where a
-- PUBLISH cannot count it -- a cluster --, else not), and keeps the
-- queue's keys alive for keep_ms. Returns joined, and the waiter's rank
-- (0: the head).
local function lock_fair_stay(queue, due, sub, w, listens, lease, now, keep_ms)
    local joined = 0
    if not redis.call('zscore', queue, w) then
        redis.call('zadd', queue, lock_fair_ticket(queue, now), w)
        joined = 1
    end
    redis.call('zadd', due, now + lease, w)
    if listens == '1' then
        redis.call('sadd', sub, w)
    elseif listens == '2' then
        redis.call('sadd', sub, '~' .. w)
    end
    for _, k in ipairs({queue, due, sub}) do
        if redis.call('pttl', k) < keep_ms then redis.call('pexpire', k, keep_ms) end
    end
    return joined, redis.call('zrank', queue, w)
end
