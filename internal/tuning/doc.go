// Package tuning holds the process-wide runtime settings a control plane
// runs with: the garbage collector's pacing for bursts of writes
// (StartGCPacing) and the memory trimmer that hands the heap back to the
// operating system once the process is quiet (MemoryTrimmer). Both are
// explained, with the figures that chose their constants, in
// docs/operations.md#memory-and-the-garbage-collector.
package tuning
