import sys, collections, re
self_c=collections.Counter(); incl=collections.Counter(); tot=0
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack,n=line.rsplit(' ',1); n=int(n)
    frames=stack.split(';')
    if any('select' in f and 'selectors' in f for f in frames[-2:]) : 
        self_c['<idle>']+=n; tot+=n; continue
    tot+=n
    def nm(f):
        m=re.match(r'(.*) \((.*?)(:\d+)?\)$',f)
        if not m: return f
        fn,path=m.group(1),m.group(2)
        return fn+' '+path.split('/cur/')[-1].split('site-packages/')[-1]
    fr=[nm(f) for f in frames]
    self_c[fr[-1]]+=n
    for f in set(fr): incl[f]+=n
print('total',tot)
k=int(sys.argv[2]) if len(sys.argv)>2 else 40
print('--- self'); 
for f,n in self_c.most_common(k): print(f'{n/tot*100:5.1f} {f}')
print('--- inclusive')
for f,n in incl.most_common(k+20): print(f'{n/tot*100:5.1f} {f}')
