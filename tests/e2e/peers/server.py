"""The suite's peer servers, run by tests/e2e/peers/start.sh in the peer
root (Debian's python3, git and openssl) on the test host's 127.0.0.1:

  8443  HTTPS with a test CA made here by openssl: static files (/index.html,
        a PEP 503 package index under /simple/ with one wheel), a git
        smart-HTTP server (/git/, git http-backend run as CGI), and /echo,
        which appends each request it gets (line, headers, body) to
        DIR/requests.log and answers only the SHA-256 of its Authorization
        header (so that a secret's value reaches the server, and the log,
        but never comes back to the guest);
  8080  the same handler over plain HTTP;
  9000  a plain TCP sink: reads to EOF, answers the byte count, closes.

    python3 server.py DIR

DIR receives ca.pem (also in DIR/pub, for the guest), the server's key and
certificate, www/, git/, server.log's lines, and then `ready`; on a failure
before that, `failed` with the reason.
"""

import base64
import functools
import hashlib
import http.server
import io
import os
import socketserver
import ssl
import subprocess
import sys
import threading
import zipfile

NAMES = ["secure.test", "git.test", "pypi.test", "api.test"]
WHEEL = "mvmprobe-1.0-py3-none-any.whl"


def run(*args, **kw):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, **kw)


def make_tls(d):
    """A CA and a server certificate for NAMES, both P-256 (fast to make
    under emulation), valid for two days."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem",
        "-days", "2", "-subj", "/CN=mvm test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", *ec, "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr",
        "-subj", f"/CN={NAMES[0]}",
        "-addext", "subjectAltName=" + ",".join(f"DNS:{n}" for n in NAMES))
    run("openssl", "x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.pem",
        "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-days", "2",
        "-copy_extensions", "copy", "-out", f"{d}/server.pem")
    with open(f"{d}/ca.pem", "rb") as src, open(f"{d}/pub/ca.pem", "wb") as dst:
        dst.write(src.read())


def make_wheel(path):
    """A minimal pure-Python wheel (PEP 427) that pip accepts."""
    files = {
        "mvmprobe/__init__.py": b"VALUE = 'mvmprobe-from-the-local-index'\n",
        "mvmprobe-1.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: mvmprobe\nVersion: 1.0\n",
        "mvmprobe-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: mvm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    for name, data in files.items():
        digest = hashlib.sha256(data).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.write(f"{name},sha256={b64},{len(data)}\n")
    record.write("mvmprobe-1.0.dist-info/RECORD,,\n")
    files["mvmprobe-1.0.dist-info/RECORD"] = record.getvalue().encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data)


def make_www(d):
    www = f"{d}/www"
    os.makedirs(f"{www}/simple/mvmprobe", exist_ok=True)
    os.makedirs(f"{www}/packages", exist_ok=True)
    with open(f"{www}/index.html", "w") as f:
        f.write("hello-over-tls\n")
    make_wheel(f"{www}/packages/{WHEEL}")
    with open(f"{www}/packages/{WHEEL}", "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(f"{www}/simple/index.html", "w") as f:
        f.write('<!DOCTYPE html><html><body><a href="mvmprobe/">mvmprobe</a></body></html>\n')
    with open(f"{www}/simple/mvmprobe/index.html", "w") as f:
        f.write(f'<!DOCTYPE html><html><body><a href="../../packages/{WHEEL}#sha256={sha}">'
                f"{WHEEL}</a></body></html>\n")
    with open(f"{d}/pub/wheel.sha256", "w") as f:
        f.write(sha + "\n")


def make_git(d):
    src = f"{d}/git-src"
    env = dict(os.environ, GIT_AUTHOR_NAME="peer", GIT_AUTHOR_EMAIL="peer@test",
               GIT_COMMITTER_NAME="peer", GIT_COMMITTER_EMAIL="peer@test")
    run("git", "init", "-q", "-b", "main", src, env=env)
    with open(f"{src}/README", "w") as f:
        f.write("cloned-over-https\n")
    run("git", "-C", src, "add", "README", env=env)
    run("git", "-C", src, "commit", "-q", "-m", "probe", env=env)
    run("git", "clone", "-q", "--bare", src, f"{d}/git/probe.git", env=env)


class Handler(http.server.SimpleHTTPRequestHandler):
    """Static files, and /git/ through git http-backend (CGI)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/git/"):
            self.git()
        elif self.path.startswith("/echo"):
            self.echo()
        else:
            super().do_GET()

    def do_POST(self):
        if self.path.startswith("/git/"):
            self.git()
        elif self.path.startswith("/echo"):
            self.echo()
        else:
            self.send_error(405)

    def echo(self):
        data = self.body()
        with self.server.log_lock, open(f"{self.server.dir}/requests.log", "ab") as f:
            f.write(f"{self.command} {self.path} {self.request_version}\n".encode())
            f.write(str(self.headers).encode())
            f.write(b"body: " + data + b"\n--\n")
        auth = (self.headers.get("Authorization") or "").encode()
        answer = f"ok {hashlib.sha256(auth).hexdigest()}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def git(self):
        path, _, query = self.path[len("/git"):].partition("?")
        data = self.body()
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": f"{self.server.dir}/git",
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(data)),
            "REMOTE_ADDR": self.client_address[0],
        }
        for header, var in [("Git-Protocol", "GIT_PROTOCOL"),
                            ("Content-Encoding", "HTTP_CONTENT_ENCODING")]:
            if self.headers.get(header):
                env[var] = self.headers[header]
        out = subprocess.run(["git", "http-backend"], input=data, env=env,
                             capture_output=True).stdout
        sep = out.find(b"\r\n\r\n")
        head, rest = (out[:sep], out[sep + 4:]) if sep >= 0 else out.split(b"\n\n", 1)
        status, headers = 200, []
        for line in head.decode().splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)


class HTTPS(http.server.ThreadingHTTPServer):
    daemon_threads = True


class Sink(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class SinkHandler(socketserver.BaseRequestHandler):
    def handle(self):
        total, buf = 0, bytearray(1 << 20)
        while True:
            n = self.request.recv_into(buf)
            if n == 0:
                break
            total += n
        self.request.sendall(f"{total}\n".encode())


def main():
    d = sys.argv[1]
    try:
        make_tls(d)
        make_www(d)
        make_git(d)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(f"{d}/server.pem", f"{d}/server.key")
        https = HTTPS(("127.0.0.1", 8443),
                      functools.partial(Handler, directory=f"{d}/www"))
        https.socket = ctx.wrap_socket(https.socket, server_side=True)
        plain = HTTPS(("127.0.0.1", 8080),
                      functools.partial(Handler, directory=f"{d}/www"))
        lock = threading.Lock()
        for server in (https, plain):
            server.dir, server.log_lock = d, lock
        sink = Sink(("127.0.0.1", 9000), SinkHandler)
    except Exception as e:  # noqa: BLE001 - any failure is the peer's report
        with open(f"{d}/failed", "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
        raise
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    open(f"{d}/ready", "w").close()
    https.serve_forever()


if __name__ == "__main__":
    main()
