"""The MinIO fixture itself: a real S3 server that stores, lists, returns and deletes
objects, keeps them across a restart, and refuses wrong credentials. The remote-storage
tests rely on all of this, so it is checked on its own first."""

from __future__ import annotations

import urllib.parse

import pytest
from botocore.exceptions import ClientError


def test_objects_round_trip(minio):
    assert minio.list_objects() == []
    minio.put_object("tenant/a/layer-1", b"x" * 1000)
    minio.put_object("tenant/a/layer-2", b"")
    minio.put_object("tenant/b/layer-1", b"other")
    assert minio.list_objects("tenant/a/") == [("tenant/a/layer-1", 1000), ("tenant/a/layer-2", 0)]
    assert minio.get_object("tenant/a/layer-1") == b"x" * 1000

    # Overwriting is how tests corrupt an object on purpose.
    minio.put_object("tenant/a/layer-1", b"corrupt")
    assert minio.get_object("tenant/a/layer-1") == b"corrupt"
    minio.delete_object("tenant/a/layer-2")
    assert minio.list_objects("tenant/") == [("tenant/a/layer-1", 7), ("tenant/b/layer-1", 5)]

    # A restart on the same data and port keeps the bucket and its objects.
    minio.stop()
    minio.start()
    assert minio.get_object("tenant/b/layer-1") == b"other"


def test_url_and_env(minio):
    url = urllib.parse.urlsplit(minio.url("tenants"))
    assert (url.scheme, url.netloc, url.path) == ("s3", minio.bucket, "/tenants")
    query = dict(urllib.parse.parse_qsl(url.query))
    assert query == {"endpoint": minio.endpoint, "region": "us-east-1", "allow_http": "true"}
    assert minio.endpoint.startswith("http://127.0.0.1:")
    assert minio.env() == {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}


@pytest.mark.parametrize("access_key, secret_key, code", [
    ("fjordtest", "wrong-secret", "SignatureDoesNotMatch"),
    ("nobody", "fjordtest-secret", "InvalidAccessKeyId"),
])
def test_wrong_credentials_refused(minio, access_key, secret_key, code):
    minio.put_object("secret", b"data")
    client = minio.client(access_key, secret_key)
    for call in (lambda: client.get_object(Bucket=minio.bucket, Key="secret"),
                 lambda: client.put_object(Bucket=minio.bucket, Key="intruder", Body=b"x")):
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == code
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert minio.list_objects() == [("secret", 4)]
