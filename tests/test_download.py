"""Downloads (resumable, checksummed), safe extraction and image URL lists, against a server on 127.0.0.1."""

import hashlib
import io
import os
import socket
import tarfile

import pandas as pd
import pytest

from conftest import jpeg_bytes, tar_bytes, zip_bytes

from noisydml.data import DatasetError
from noisydml.data.download import Archive, DownloadError, fetch_archive, fetch_url_list, safe_extract


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_download_verifies_and_is_idempotent(tmp_path, local_server):
    base, served = local_server
    data = os.urandom(300_000)
    served.files["/a.tgz"] = data
    archive = Archive("a.tgz", f"{base}/a.tgz", _sha(data))
    path, sha, verified = fetch_archive(archive, tmp_path, progress=False)
    assert path.read_bytes() == data and sha == _sha(data) and verified
    assert not (tmp_path / "a.tgz.part").exists()
    fetch_archive(archive, tmp_path, progress=False)  # already there: verified, not fetched again
    assert len(served.log) == 1


def test_wrong_checksum_is_a_clear_error_and_the_file_is_not_kept(tmp_path, local_server):
    base, served = local_server
    served.files["/a.tgz"] = b"tampered" * 1000
    archive = Archive("a.tgz", f"{base}/a.tgz", "0" * 64)
    with pytest.raises(DownloadError, match=r"sha256 mismatch: expected 0{64}, got [0-9a-f]{64}.*was deleted"):
        fetch_archive(archive, tmp_path, progress=False, backoff=0)
    assert not (tmp_path / "a.tgz").exists() and not (tmp_path / "a.tgz.part").exists()
    # a file put in place by hand with the wrong content: refused and left for the user to replace
    (tmp_path / "a.tgz").write_bytes(b"wrong")
    with pytest.raises(DownloadError, match="left in place"):
        fetch_archive(archive, tmp_path, progress=False)


def test_an_interrupted_download_resumes_with_a_range_request(tmp_path, local_server):
    base, served = local_server
    data = os.urandom(2_000_000)
    served.files["/big.zip"] = data
    served.cut_once.add("/big.zip")
    path, _, _ = fetch_archive(Archive("big.zip", f"{base}/big.zip", _sha(data)), tmp_path, progress=False, backoff=0)
    assert path.read_bytes() == data
    assert served.log[0] == ("/big.zip", None)
    assert served.log[1][1] == f"bytes={len(data) // 2}-"  # only the missing half was asked for


def test_a_partial_file_from_an_earlier_run_is_resumed(tmp_path, local_server):
    base, served = local_server
    data = os.urandom(100_000)
    served.files["/a.tgz"] = data
    (tmp_path / "a.tgz.part").write_bytes(data[:40_000])
    fetch_archive(Archive("a.tgz", f"{base}/a.tgz", _sha(data)), tmp_path, progress=False)
    assert served.log == [("/a.tgz", "bytes=40000-")] and (tmp_path / "a.tgz").read_bytes() == data


def test_no_network_says_where_to_get_the_archive_and_where_to_put_it(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    archive = Archive("car_ims.tgz", f"http://127.0.0.1:{port}/car_ims.tgz", "a" * 64,
                      where="from a mirror of Stanford Cars (its original host is gone)")
    with pytest.raises(DownloadError) as e:
        fetch_archive(archive, tmp_path / "downloads", retries=1, progress=False, backoff=0)
    msg = str(e.value)
    assert "could not be fetched after 2 attempts" in msg and "original host is gone" in msg
    assert str((tmp_path / "downloads" / "car_ims.tgz").resolve()) in msg
    # an owner-only dataset: no URL at all
    with pytest.raises(DownloadError, match="given out only by its owners"):
        fetch_archive(Archive("In-shop.zip", where="on request from the DeepFashion authors"), tmp_path)


def test_a_missing_file_on_the_server_is_not_retried(tmp_path, local_server):
    base, served = local_server
    with pytest.raises(DownloadError, match="answered HTTP 404"):
        fetch_archive(Archive("gone.tgz", f"{base}/gone.tgz"), tmp_path, progress=False)
    assert len(served.log) == 1


def test_extraction_is_atomic_idempotent_and_refuses_escapes(tmp_path):
    good = tmp_path / "good.tgz"
    good.write_bytes(tar_bytes({"root/a.txt": b"a", "root/sub/b.txt": b"b"}))
    out = safe_extract(good, tmp_path / "out", "sha-good", progress=False)
    assert (out / "root/sub/b.txt").read_bytes() == b"b"
    (out / "root/a.txt").write_bytes(b"changed")
    safe_extract(good, tmp_path / "out", "sha-good", progress=False)  # same archive: nothing is redone
    assert (out / "root/a.txt").read_bytes() == b"changed"
    # a second archive with the same top folder adds to it
    other = tmp_path / "other.tgz"
    other.write_bytes(tar_bytes({"root/sub/c.txt": b"c"}))
    safe_extract(other, tmp_path / "out", "sha-other", progress=False)
    assert sorted(p.name for p in (out / "root/sub").iterdir()) == ["b.txt", "c.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".extracting")]

    evil = tmp_path / "evil.tgz"
    evil.write_bytes(tar_bytes({"root/ok.txt": b"ok", "../escaped.txt": b"x"}))
    with pytest.raises(DatasetError, match=r"'\.\./escaped\.txt' refused"):
        safe_extract(evil, tmp_path / "evil", "sha-evil", progress=False)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "evil" / "root").exists()

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        link = tarfile.TarInfo("root/link")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        tf.addfile(link)
    (tmp_path / "link.tar").write_bytes(buf.getvalue())
    with pytest.raises(DatasetError, match="'root/link' refused"):
        safe_extract(tmp_path / "link.tar", tmp_path / "link", "sha-link", progress=False)

    for name, members in (("abs.zip", {"ok.txt": b"ok", "/abs/evil.txt": b"x"}),
                          ("dots.zip", {"a/../../evil.txt": b"x"})):
        (tmp_path / name).write_bytes(zip_bytes(members))
        with pytest.raises(DatasetError, match="outside the target folder"):
            safe_extract(tmp_path / name, tmp_path / "z", name, progress=False)
    assert not (tmp_path / "evil.txt").exists()


def test_url_list_records_dead_links_and_non_images_and_keeps_the_rest(tmp_path, local_server):
    base, served = local_server
    served.files["/img/1.jpg"] = jpeg_bytes(1)
    served.files["/img/2.jpg"] = jpeg_bytes(2)
    served.files["/img/page.jpg"] = b"<html>moved</html>"
    items = pd.DataFrame({"url": [f"{base}/img/1.jpg", f"{base}/img/dead.jpg", f"{base}/img/page.jpg",
                                  f"{base}/img/2.jpg"],
                          "path": ["images/0/1.jpg", "images/0/dead.jpg", "images/1/page.jpg", "images/1/2.jpg"]})
    got = fetch_url_list(items, tmp_path, retries=1, workers=2, progress=False, backoff=0)
    assert list(got["status"]) == ["ok", "dead", "not_image", "ok"]
    assert got["detail"][1] == "HTTP 404"
    assert (tmp_path / "images/1/2.jpg").read_bytes() == served.files["/img/2.jpg"]
    assert not (tmp_path / "images/1/page.jpg").exists()
    again = fetch_url_list(items, tmp_path, retries=0, workers=2, progress=False)
    assert list(again["status"]) == ["present", "dead", "not_image", "present"]
