"""mxu.sim: how the chip is run. Verilog generation, simulator builds, drivers."""
