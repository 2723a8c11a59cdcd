"""Two measured workloads and their pairs, in Lucid's columns (sim/colocation.py): the
interference table the simulator's tests share."""

from __future__ import annotations

from pathlib import Path

SINGLE = "model,dataset,batchsize,amp,speed,gpu_util,gmem,label\n"
SINGLE += "A,d,32,0,1,50,4000,0\nB,d,32,0,1,30,2000,0\n"
PAIRS = ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
PAIRS += "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem\n"
PAIRS += "0,A,d,1,32,0,0.8,B,d,1,32,0,0.6,70,30,6000\n1,A,d,1,32,0,0.7,A,d,1,32,0,0.7,80,40,8000\n"
PAIRS += "2,B,d,1,32,0,0.9,B,d,1,32,0,0.9,45,20,4000\n"


def write_lucid(folder: Path) -> Path:
    """`folder/lucid` with the two tables; returns that folder."""
    lucid = folder / "lucid"
    lucid.mkdir()
    (lucid / "single_data.csv").write_text(SINGLE)
    (lucid / "colocate_info.csv").write_text(PAIRS)
    return lucid
