-- Nexmark q9, winning bids: each auction with its highest bid made while
-- it was open (the earliest of equal bids).
-- Published (Flink):
--   SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller, category, extra,
--          auction, bidder, price, bid_dateTime, bid_extra
--   FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, B.extra AS bid_extra,
--           ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) AS rownum
--         FROM auction A, bid B
--         WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
--   WHERE rownum <= 1
-- ubik: the comma join's conditions are written as JOIN ... ON (as in q3).
-- An interval join bounded by each auction's expires: an auction is held
-- until the watermark passes its expires, a bid until it passes the bid's
-- time. The changelog is keyed by the auction id and upserts it when a
-- higher bid comes in. Bids equal in price and time are told apart by
-- their other columns the result holds (ascending; channel and url are
-- not in it).
-- oracle: SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra,
-- oracle:        auction, bidder, price, bid_date_time, bid_extra
-- oracle: FROM (SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,
-- oracle:         ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC,
-- oracle:           A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires, A.seller,
-- oracle:           A.category, A.extra, B.auction, B.bidder, B.price, B.date_time, B.extra) AS rownum
-- oracle:       FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
-- oracle: WHERE rownum <= 1
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra,
       auction, bidder, price, bid_date_time, bid_extra
FROM (SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,
        ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
      FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
WHERE rownum <= 1
