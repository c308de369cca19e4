"""placeholder, replaced below"""
def add_arguments(p):
    p.add_argument("--pairs")
def main(args):
    return 0
