"""boto3 cross-check of the SigV4 signer: for one frozen instant and the same credentials, the
presigned GET URL from botocore's generate_presigned_url equals ours byte for byte (path-style
and virtual-hosted endpoints, with and without a session token, awkward keys, extra query
parameters). Ours comes from `test_sigv4 --presign` (the unit-test binary next to BIN_DIR)."""
import datetime
import os
import subprocess
import types
import urllib.parse
from unittest import mock

import pytest

from conftest import BIN_DIR

boto3 = pytest.importorskip("boto3")
import botocore.auth  # noqa: E402
from botocore.config import Config  # noqa: E402

TEST_BIN = os.path.join(os.path.dirname(str(BIN_DIR)), "tests", "test_sigv4")
if not os.access(TEST_BIN, os.X_OK):
    pytest.skip(f"{TEST_BIN} not built (make MODE=san unit-bins)", allow_module_level=True)

NOW = datetime.datetime(2024, 2, 29, 23, 59, 58)  # a leap day, one second before a new scope
ACCESS = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEPT//////////wEaDExAMPLE+token/with=padding=="
REGION = "eu-west-1"
BUCKET = "my-bucket"
EXPIRES = 3600

KEYS = [
    "plain.txt",
    "with spaces/and  double  spaces.txt",
    "unicode/caf\u00e9/\u1234/\U0001f600.bin",
    "plus+sign.txt",
    "equals=sign.txt",
    "amp&ersand.txt",
    "tilde~file.txt",
    "a/b/c/d/e/f/g/h/i/j/deep.txt",
    "100%.txt",
    "pct%20not-an-escape",
    "dot/./segments/../kept",
    "//leading-and//double-slashes/",
    "reserved !$'()*,;:@[]#?.txt",
]

ENDPOINTS = {
    "path": ("http://127.0.0.1:9000", "path"),
    "virtual": ("https://s3.eu-west-1.amazonaws.com", "virtual"),
}


class FrozenDatetime(datetime.datetime):
    @classmethod
    def utcnow(cls):
        return NOW

    @classmethod
    def now(cls, tz=None):
        return NOW.replace(tzinfo=tz)


def frozen_botocore_clock():
    """botocore.auth reads the time through its module-level `datetime`: swap in a namespace
    whose datetime class always answers NOW (botocore <1.31 calls utcnow(), later now(utc))."""
    ns = types.SimpleNamespace(**{k: getattr(datetime, k) for k in dir(datetime)
                                  if not k.startswith("_")})
    ns.datetime = FrozenDatetime
    return mock.patch.object(botocore.auth, "datetime", ns)


def boto_url(endpoint, style, token, key, params):
    client = boto3.client(
        "s3", region_name=REGION, endpoint_url=endpoint, aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET, aws_session_token=token,
        config=Config(signature_version="s3v4", s3={"addressing_style": style}))
    with frozen_botocore_clock():
        return client.generate_presigned_url(
            "get_object", Params=dict(Bucket=BUCKET, Key=key, **params), ExpiresIn=EXPIRES)


def ours(args):
    out = subprocess.run([TEST_BIN, *args], capture_output=True, text=True, check=True)
    return out.stdout.rstrip("\n")


def our_url(endpoint, style, token, key, query):
    split = urllib.parse.urlsplit(endpoint)
    path_key = ours(["--uri-encode", "1", key])
    if style == "virtual":
        host, path = f"{BUCKET}.{split.netloc}", "/" + path_key
    else:
        host, path = split.netloc, f"/{BUCKET}/{path_key}"
    unix = str(int(NOW.replace(tzinfo=datetime.timezone.utc).timestamp()))
    q = ours(["--presign", ACCESS, SECRET, token or "", REGION, host, path, query, str(EXPIRES),
              unix])
    return f"{split.scheme}://{host}{path}?{q}"


def test_frozen_clock_reaches_botocore():
    url = boto_url(*ENDPOINTS["path"], None, "plain.txt", {})
    assert "X-Amz-Date=20240229T235958Z" in url


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "session-token"])
@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
@pytest.mark.parametrize("key", KEYS)
def test_presigned_url_matches_boto3(key, endpoint, token):
    ep, style = ENDPOINTS[endpoint]
    assert our_url(ep, style, token, key, "") == boto_url(ep, style, token, key, {})


# Operation parameters that botocore puts in the query: they come first, in boto3's order (the
# operation's member order), then the X-Amz-* ones. Our QUERY input is what a caller would send.
PARAM_CASES = [
    ({"VersionId": "3/L4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY+MTRCxf3vjVBH40Nr8X8gdRQBpUMLUo"},
     "versionId=3%2FL4kqtJlcpXroDTDmJ%2BrmSpXd3dIbrHY%2BMTRCxf3vjVBH40Nr8X8gdRQBpUMLUo"),
    ({"ResponseContentDisposition": 'attachment; filename="a b.txt"',
      "ResponseContentType": "text/plain; charset=utf-8"},
     "response-content-disposition=attachment%3B%20filename%3D%22a%20b.txt%22"
     "&response-content-type=text%2Fplain%3B%20charset%3Dutf-8"),
]


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "session-token"])
@pytest.mark.parametrize("params,query", PARAM_CASES, ids=["version-id", "response-headers"])
def test_presigned_url_with_query_matches_boto3(params, query, token):
    ep, style = ENDPOINTS["path"]
    assert our_url(ep, style, token, "q/key.txt", query) == boto_url(ep, style, token,
                                                                     "q/key.txt", params)
