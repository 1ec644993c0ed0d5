"""Jobs that gpupool ships: the reference training job that follows the job convention."""
