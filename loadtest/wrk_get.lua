-- wrk_get.lua: GET the URL through wrk's connections, a request formatted
-- per call and every status counted, as wrk_orders.lua does for its POSTs:
-- so that when `make bench` compares a GET with a POST (the sold-out POST
-- against /healthz) the load generator does the same work for both, and
-- the ratio is the server's. Prints "STATUS 200=n ... errors=n".
local threads, n = {}, 0

function setup(thread)
    thread:set("id", #threads)
    table.insert(threads, thread)
end

function init(args)
    statuses = {}
end

function request()
    n = n + 1
    return wrk.format("GET", nil, { ["X-Seq"] = string.format("%d-%d", id, n) })
end

function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
    local all = {}
    for _, t in ipairs(threads) do
        for status, count in pairs(t:get("statuses")) do
            all[status] = (all[status] or 0) + count
        end
    end
    local parts = {}
    for status, count in pairs(all) do table.insert(parts, status .. "=" .. count) end
    table.sort(parts)
    local e = summary.errors
    io.write("STATUS " .. table.concat(parts, " ") .. " errors=" ..
             (e.connect + e.read + e.write + e.timeout) .. "\n")
end
