-- Nexmark q20, expand bid with auction: each bid on an auction of
-- category 10, with the auction's columns.
-- Published (Flink, a regular join):
--   SELECT auction, bidder, price, channel, url, B.dateTime, B.extra,
--          itemName, description, initialBid, reserve, A.dateTime, expires, seller, category, A.extra
--   FROM bid AS B INNER JOIN auction AS A on B.auction = A.id WHERE A.category = 10
-- ubik: the regular join holds every bid and auction forever, which ubik
-- refuses; this is a temporal join instead, of each bid with its auction
-- as of the bid's time (the auctions are a versioned table keyed by id,
-- valid from their date_time, the generator's declared event time). It
-- keeps one row per auction and no bids. It leaves out the bids the
-- generator makes on auctions it opens a moment later (its "in flight"
-- auctions): 5.3% of the pairs on this test's stream. The auction's
-- date_time and extra are renamed (a_date_time, a_extra): a result row is
-- a JSON object, with one value per name. Over Kafka, with the tables'
-- schemas declared, name the version time: --event-time date_time.
-- oracle: SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time, B.extra,
-- oracle:        A.item_name, A.description, A.initial_bid, A.reserve, A.date_time AS a_date_time, A.expires,
-- oracle:        A.seller, A.category, A.extra AS a_extra
-- oracle: FROM bid B JOIN auction A ON B.auction = A.id AND A.date_time <= B.date_time WHERE A.category = 10
SELECT
    auction, bidder, price, channel, url, B.date_time, B.extra,
    item_name, description, initial_bid, reserve, A.date_time AS a_date_time, expires,
    seller, category, A.extra AS a_extra
FROM bid AS B
JOIN auction FOR SYSTEM_TIME AS OF B.date_time AS A ON B.auction = A.id
WHERE A.category = 10
