"""Job-history analysis that needs no pool: parsing traces and accounting, the workload
audit, the replay metrics and reports. Imports nothing else of gpupool."""
