import socket, sys, time, os
# streams.py port N hold_seconds read(0/1) [lei]
port=int(sys.argv[1]); n=int(sys.argv[2]); hold=float(sys.argv[3]); rd=sys.argv[4]=='1'; lei=sys.argv[5] if len(sys.argv)>5 else None
socks=[]; codes={}
for i in range(n):
    s=socket.create_connection(('127.0.0.1',port))
    if not rd: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    req=f"GET /v1/leases/events HTTP/1.1\r\nHost: x\r\n"+(f"Last-Event-ID: {lei}\r\n" if lei else "")+"\r\n"
    s.sendall(req.encode()); socks.append(s)
time.sleep(1)
for s in socks:
    s.settimeout(0.5)
    try:
        d=s.recv(200); c=d.split(b' ')[1].decode() if d else 'eof'
    except Exception as e: c='timeout'
    codes[c]=codes.get(c,0)+1
print('codes',codes, flush=True)
t0=time.time()
while time.time()-t0<hold:
    if rd:
        for s in socks:
            s.setblocking(False)
            try:
                while s.recv(65536): pass
            except Exception: pass
    time.sleep(0.5)
for s in socks: s.close()
