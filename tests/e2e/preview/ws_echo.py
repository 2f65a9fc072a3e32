"""A WebSocket echo server on the standard library alone (the sandbox image has no websockets package and
no route out to fetch one): answers the handshake (RFC 6455), then sends every text or binary message back
prefixed with "echo: ", answers pings, and closes when asked. Usage: python3 ws_echo.py PORT"""

import base64
import hashlib
import socketserver
import struct
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(f, n):
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def send(w, opcode, payload):
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    w.write(head + payload)
    w.flush()


class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        headers = {}
        request_line = self.rfile.readline()
        while True:
            line = self.rfile.readline().decode("latin-1").strip()
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        key = headers.get("sec-websocket-key")
        if not key or headers.get("upgrade", "").lower() != "websocket":
            body = b"a WebSocket echo server: " + request_line.strip() + b"\n"
            self.wfile.write(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest())
        self.wfile.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self.wfile.flush()
        try:
            while True:
                b0, b1 = read_exact(self.rfile, 2)
                opcode, n = b0 & 0x0F, b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", read_exact(self.rfile, 2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", read_exact(self.rfile, 8))[0]
                mask = read_exact(self.rfile, 4) if b1 & 0x80 else b"\0\0\0\0"
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(self.rfile, n)))
                if opcode == 8:
                    send(self.wfile, 8, payload[:2])
                    return
                if opcode == 9:
                    send(self.wfile, 10, payload)
                elif opcode in (1, 2):
                    send(self.wfile, opcode, b"echo: " + payload)
        except (EOFError, ConnectionError):
            return


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


Server(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
