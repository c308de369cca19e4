import sys, os
v = os.environ.get("KVGATE_TEST_SWITCH")
if v and any("serve" == a for a in sys.argv):
    sys.setswitchinterval(float(v))
    sys.stderr.write(f"switchinterval {sys.getswitchinterval()}\n")
