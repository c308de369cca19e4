# ad-hoc: in kvgate serve only, write {native_id: thread name} every second
import sys, os
if "serve" in sys.argv and any("kvgate" in a for a in sys.argv) or (len(sys.argv) > 2 and sys.argv[1:3] == ["-m", "kvgate.middleware.cli"]):
    pass
def _start():
    import threading, json, time
    def run():
        path = f"/tmp/b41/out/threads-{os.getpid()}.json"
        while True:
            try:
                m = {t.native_id: t.name for t in threading.enumerate()}
                json.dump(m, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
            except Exception:
                pass
            time.sleep(1.0)
    threading.Thread(target=run, name="adhoc-names", daemon=True).start()
try:
    argv = open(f"/proc/{os.getpid()}/cmdline","rb").read().split(b"\0")
    if b"serve" in argv and any(b"kvgate" in a for a in argv) and b"bench" not in argv:
        _start()
except Exception:
    pass
