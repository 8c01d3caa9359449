# Speed of each CPU: best of 5 of a fixed pure-Python loop, pinned to that CPU alone.
for c in $(seq 0 $(($(nproc)-1))); do
  printf "cpu %2d " $c; taskset -c $c python3 -c "
import time
b=[]
for _ in range(5):
    t=time.perf_counter(); sum(i*i for i in range(200000)); b.append((time.perf_counter()-t)*1e3)
print(f'best {min(b):5.1f} ms  worst {max(b):5.1f} ms')"
done
