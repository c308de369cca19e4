import json, sys, statistics
v=json.load(open(sys.argv[1]))
for arm,a in v['routers'].items():
    if not arm.startswith('kvgate'): continue
    recs=[r for run in a['runs'] for r in run.get('request_records',[]) if 'proxy_ms' in r]
    for label,f in (('first',lambda r:r['t']==0),('later',lambda r:r['t']>0)):
        sub=[r['proxy_ms'] for r in recs if f(r)]
        keys=[k for k in sub[0] if k!='engine']
        print(arm,label,len(sub),'  '.join(f"{k} {statistics.mean(s[k] for s in sub):.2f}/{sorted(s[k] for s in sub)[len(sub)//2]:.2f}" for k in keys))
