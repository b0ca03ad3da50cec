#!/usr/bin/env bash
# Session 29, device calls 5-8 (the same warm machine as calls 3-4): micro.py on both trees (.dev_pre = 4ec7e5e,
# main), same skeleton. Call 5: the talker frame at B = 1, 32, pre then main, twice. Calls 6 and 7 failed
# before measuring (6: `--parts audio` is no part, it is `encoders`; 7: the skeleton had gone with the tree
# re-sent, make_skeleton missing). Call 8: the thinker decode step at B = 1, 32, pre then main.
. benchmarks/h200_common.sh; install_wheels >/dev/null; make_skeleton .gpu/full-skel qwen3-omni-30b-a3b >/dev/null
PART=${PART:-talker}; RUNS=${RUNS:-1 2}
for i in $RUNS; do for t in pre main; do d=.; [ $t = pre ] && d=.dev_pre
  (cd $d && PYTHONPATH=/tmp/site:$PWD timeout 80 python3 benchmarks/micro.py $OLDPWD/.gpu/full-skel --parts $PART \
    --${PART}-batches 1,32 --out /tmp/m_$t$i >/tmp/m_$t$i.log 2>&1
   echo "$t run $i rc=$?"; grep -E "^\| (1|32) \|" /tmp/m_$t$i/micro.md | cut -c1-90; cp /tmp/m_$t$i/micro.md $OUT/${PART}_${t}_$i.md)
done; done
# call 5: PART=talker RUNS="1 2"; call 8: PART=thinker RUNS=1 (files thinker_{pre,main}.md)
