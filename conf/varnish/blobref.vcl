vcl 4.1;
# Varnish in front of blobrefd: the documented example (README, "Behind a CDN"), and the VCL the
# test suite runs (tests/integration/test_varnish.py substitutes the backend's host and port).
#
#   varnishd -a :6081 -f /etc/varnish/blobref.vcl -s malloc,1G
#
# What it does:
# - Caches GET/HEAD of /v1/blobs/{hash} for as long as blobrefd's Cache-Control says: blob bytes
#   come with `public, max-age=31536000, immutable` (a blob id is its content, it never changes).
#   `/v1/blobs/sha256:<hex>` and `/v1/blobs/<hex>` are one object; the Host header and any query
#   string are not part of the key (a PURGE from blobrefd, whatever Host it sends, hits).
# - Passes everything else: uploads, lookups, /meta, /metrics, admin calls, and every request that
#   carries Authorization (it may be allowed more than an anonymous client: never share its
#   answer). Only anonymous reads are cached, so run blobrefd with `[auth] anonymous = read` for
#   the blobs the edge may serve. Writes through the edge reach blobrefd, which wants a token.
# - Never caches what blobrefd says not to: errors carry `Cache-Control: no-store` (a 404 for a
#   blob not uploaded yet is not remembered: the upload that follows is visible at once), and
#   redirects `private, max-age=N` (a shared cache may not store them at all; a 307 always asks
#   blobrefd, so it is never cached longer than its max-age). An error without Cache-Control is not
#   cached either.
# - Ranges: on a miss Varnish fetches the whole blob (it drops Range from the backend request)
#   and serves 206 from the cached object, for this and every later Range request; If-None-Match
#   is answered 304 from the cached ETag. Blobs over 1 GiB are not cached (hit-for-pass for an
#   hour): their Range requests go to blobrefd as they are.
# - PURGE /v1/blobs/{hash} (drop the object now) and BAN /v1/blobs/{hash} (ban it: the ban lurker
#   removes it in the background) from the addresses in acl purgers; 403 from anywhere else.
#   A quarantined blob must stop being served from the edge: purge it right after
#   `DELETE /v1/blobs/{hash}` (blobrefd will send these purges itself, see [cdn] in the README).
#
# Optional: for an origin with `[auth] anonymous = none`, give the edge its own read token by
# adding `set bereq.http.Authorization = "Bearer br_...";` to vcl_backend_fetch for cacheable
# fetches (`if (!bereq.uncacheable)`), and decide in vcl_recv who may read through the edge.

import std;

backend blobrefd {
    .host = "127.0.0.1";
    .port = "8080";
    .connect_timeout = 2s;
    .first_byte_timeout = 60s;
    .between_bytes_timeout = 60s;
}

acl purgers {
    "127.0.0.1";
    "::1";
}

sub vcl_recv {
    # one spelling per blob: sha256:<hex> (also %3A-encoded) is <hex>; no query string on blobs
    if (req.url ~ "^/v1/blobs/(?i:sha256(:|%3a))[0-9a-f]{64}(\?.*)?$") {
        set req.url = regsub(req.url, "^/v1/blobs/(?i:sha256(:|%3a))", "/v1/blobs/");
    }
    if (req.url ~ "^/v1/blobs/[0-9a-f]{64}\?") {
        set req.url = regsub(req.url, "\?.*$", "");
    }

    if (req.method == "PURGE" || req.method == "BAN") {
        if (client.ip !~ purgers) {
            return (synth(403, "Forbidden"));
        }
        if (req.url !~ "^/v1/blobs/[0-9a-f]{64}$") {
            return (synth(400, "PURGE and BAN take /v1/blobs/{hash}"));
        }
        if (req.method == "PURGE") {
            return (purge);
        }
        ban("obj.http.x-blobref-url == " + req.url);
        return (synth(200, "Banned"));
    }

    if ((req.method == "GET" || req.method == "HEAD") && req.url ~ "^/v1/blobs/[0-9a-f]{64}$") {
        if (req.http.Authorization) {
            return (pass);
        }
        unset req.http.Cookie;
        return (hash);
    }
    return (pass);
}

sub vcl_hash {
    # the blob id is the whole identity: not the Host, not the query
    hash_data(req.url);
    return (lookup);
}

sub vcl_backend_response {
    if (bereq.uncacheable) {
        return (deliver);
    }
    # for BAN (the lurker tests objects, not requests)
    set beresp.http.x-blobref-url = bereq.url;
    if (beresp.status >= 400 && !beresp.http.Cache-Control) {
        set beresp.uncacheable = true;
        set beresp.ttl = 0s;
        return (deliver);
    }
    if (beresp.status == 200 &&
        std.integer(s = beresp.http.Content-Length, fallback = 0) > 1073741824) {
        return (pass(1h));
    }
    # everything else as the builtin VCL does: the TTL from Cache-Control (max-age, s-maxage);
    # no-store, no-cache and private are not stored (hit-for-miss), Set-Cookie neither
}

sub vcl_deliver {
    unset resp.http.x-blobref-url;
    if (obj.hits > 0) {
        set resp.http.X-Cache = "HIT";
    } else {
        set resp.http.X-Cache = "MISS";
    }
}
