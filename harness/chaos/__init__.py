"""The chaos driver: real electors, workers and beats, with faults injected at random."""
