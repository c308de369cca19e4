import sys, collections, re
def nm(f):
    m=re.match(r'(.*) \((.*?)(:\d+)?\)$',f)
    if not m: return f
    return m.group(1)+' '+m.group(2).split('/cur/')[-1].split('site-packages/')[-1].split('/lib/python3.11/')[-1]
target=sys.argv[2]; depth=int(sys.argv[3]) if len(sys.argv)>3 else 2
tot=0; kids=collections.Counter(); base=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,n=line.rsplit(' ',1); n=int(n); fr=[nm(f) for f in stack.split(';')]
    if 'Thread._bootstrap threading.py' in fr: continue
    tot+=n
    idx=[i for i,f in enumerate(fr) if target in f]
    if not idx: continue
    i=idx[0]; base+=n
    sub=fr[i+1:i+1+depth]
    kids[' > '.join(sub) if sub else '<self>']+=n
print(f'{target}: {base/tot*100:.1f}% of main thread')
for k,n in kids.most_common(40): print(f'{n/tot*100:5.1f} {k}')
